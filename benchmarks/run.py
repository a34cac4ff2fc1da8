"""The scale benchmark: ``forensics`` stage by stage against the load-once floor and a pandas peer.

For each size of the ladder (default 1M, 2M, 4M, 8M and 16M requests) it makes sure the case
exists in ``benchmarks/.cache/`` (generated once by ``casegen.py``, as Parquet and as JSON
Lines .gz, keyed by generator version, seed, size and fleet), then times, each in a fresh
process with its peak resident memory:

- the load-once floor (``references.py floor``) for every format;
- the pandas peer (``references.py peer``) on the Parquet case;
- ``forensics ingest``, ``detect`` and ``report`` one after the other on a fresh database, then
  ``forensics run`` on another fresh database (JSON Lines: ingest only unless
  ``--jsonl-stages all``: the later stages read the same database whatever the input format);
- ``weak``: ``forensics detect`` and ``report`` once more on the same database with a weak
  signal firing on many requests (``latency_too_good`` loosened to call about one request in
  sixteen ``possible``): the report must stay bounded in time and memory whatever the counts;
- ``spark``: ``forensics detect --engine spark`` on Spark in local mode (``local[2]`` here),
  after the DuckDB detection on the same database, when pyspark and a Java runtime are
  installed. One machine is where Spark is slowest: the column shows that the same detection
  runs on it, and what its fixed costs are, not what a cluster does.

It prints one table and writes it with every measurement as JSON (``--out``, default
``benchmarks/results/latest.json``). A stage that fails, is killed or runs past ``--timeout``
is recorded as such with the last line it printed; the stages that need its result are
skipped and the next size goes on. ``--small`` is the 200,000-request mode CI runs (8 prefill
and 8 decode nodes, 500 tenants: the traffic density per node of the ladder): it proves the
harness works, exits 1 when a stage fails or Spark finds other than DuckDB, and asserts
nothing about time.

Usage::

    python benchmarks/run.py [--sizes 1M,2M,4M,8M,16M] [--formats parquet,jsonl]
        [--stages ingest,detect,spark,report,weak,run] [--jsonl-stages ingest|all]
        [--memory-limit 1GB] [--timeout 3600]
        [--cache DIR] [--out FILE] [--append] [--no-peer]
    python benchmarks/run.py --show [--out FILE]
    python benchmarks/run.py --small [--cache DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import casegen  # noqa: E402

LADDER = (1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000)
SMALL = 200_000
STAGES = ("ingest", "detect", "spark", "report", "weak", "run")
# The weak-signal pass: latency_too_good made loose enough to call about one request in
# sixteen `possible`, the way a weak signal fires on a real incident's traffic; the report
# must still render in bounded time and memory.
WEAK_DETECTION = {"latency_factor": "0.99", "min_prompt_tokens": "1024"}
GROWTH_COLUMNS = ("ingest", "detect", "spark", "report", "run")  # the table's "i d s r run"
SPARK_MASTER = "local[2]"
FORENSICS = Path(sys.executable).with_name("forensics")


def parse_size(text: str) -> int:
    """``"4M"``, ``"500K"`` or ``"200000"`` as a request count.

    >>> parse_size("4M"), parse_size("500k"), parse_size("200000")
    (4000000, 500000, 200000)
    """
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def label(requests: int) -> str:
    """A request count as the ladder names it.

    >>> label(4_000_000), label(200_000), label(1_500_000)
    ('4M', '200K', '1.5M')
    """
    if requests >= 1_000_000:
        return f"{requests / 1e6:g}M"
    return f"{requests / 1e3:g}K"


def measure(cmd: list[str], timeout: float, cwd: Path | None = None) -> dict:
    """Run ``cmd`` in a fresh process: wall seconds, its peak RSS and how it ended."""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"kv-bench-{os.getpid()}.log"
    with open(log, "w+b") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        deadline = start + timeout
        status = rusage = None
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, rusage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    log.unlink(missing_ok=True)
    lines = [line for line in text.splitlines() if line.strip()]
    result = {
        "seconds": round(seconds, 2),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "peak_rss_mb": round(rusage.ru_maxrss / 1024),
        "exit": proc.returncode,
        "outcome": "ok",
        "last_line": lines[-1][:300] if lines else "",
    }
    if seconds > timeout:
        result["outcome"] = f"timeout after {timeout:.0f} s"
    elif proc.returncode < 0:
        result["outcome"] = f"killed by signal {-proc.returncode}"
    elif proc.returncode != 0:
        result["outcome"] = f"failed (exit {proc.returncode})"
    result["output"] = text
    return result


def ensure_case(
    cache: Path,
    requests: int,
    seed: int,
    small: bool,
    timeout: float,
    formats: tuple[str, ...] = casegen.FORMATS,
) -> Path:
    """The cached case folder for this size, generated (in a child process) when missing.

    A cached case lacking one of ``formats`` (generated with ``casegen.py --formats`` for
    the others) gets it added: the same seed gives the same case, which the counts check.
    """
    shape = "small" if small else "fleet64"
    folder = cache / f"v{casegen.GENERATOR_VERSION}-seed{seed}-{requests}-{shape}"
    if (folder / "meta.json").exists():
        meta = json.loads((folder / "meta.json").read_text())
        missing = [f for f in formats if f not in meta["bytes"] or not (folder / f).is_dir()]
        if not missing:
            return folder
        extra = folder.parent / f"{folder.name}.more"
        _generate(extra, requests, seed, shape, missing, timeout)
        more = json.loads((extra / "meta.json").read_text())
        counted = ("requests", "engine_legs", "affected", "pool_snapshots", "tenants")
        if any(more[k] != meta[k] for k in counted):
            raise SystemExit(f"{folder}: the formats added do not hold the same case")
        for fmt in missing:
            shutil.rmtree(folder / fmt, ignore_errors=True)
            (extra / fmt).rename(folder / fmt)
            meta["bytes"][fmt] = more["bytes"][fmt]
        (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(extra)
        return folder
    _generate(folder, requests, seed, shape, list(casegen.FORMATS), timeout)
    return folder


def _generate(
    folder: Path, requests: int, seed: int, shape: str, formats: list[str], timeout: float
) -> None:
    cmd = [sys.executable, str(HERE / "casegen.py"), str(folder), "--requests", str(requests)]
    cmd += ["--seed", str(seed), "--shape", shape, "--formats", ",".join(formats)]
    print(f"generating {label(requests)} requests ({', '.join(formats)}) into {folder} ...")
    sys.stdout.flush()
    result = measure(cmd, timeout)
    if result["outcome"] != "ok":
        raise SystemExit(f"case generation failed: {result['outcome']}: {result['last_line']}")
    print(f"  generated in {result['seconds']:.1f} s, peak {result['peak_rss_mb']:,} MB")


def counts(database: Path) -> dict:
    """What detection found, to show both sides measured the same case."""
    import duckdb

    con = duckdb.connect(str(database), read_only=True)
    try:
        affected, exposures, possible = con.execute(
            """SELECT (SELECT count(*) FROM findings_affected
                       WHERE verdict IN ('confirmed', 'likely')),
                      (SELECT count(*) FROM findings_exposures),
                      (SELECT count(*) FROM findings_affected WHERE verdict = 'possible')"""
        ).fetchone()
    finally:
        con.close()
    return {"affected": affected, "exposures": exposures, "possible": possible}


def weak_manifest(case: Path) -> Path:
    r"""A copy of the case's manifest beside it, on the same evidence and database, whose
    ``[detection]`` sets WEAK_DETECTION.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "case.toml").write_text(
    ...     '[incident]\nid = "x"\n\n[detection]\nlatency_factor = 0.2\noverlap_window = "15m"\n')
    >>> print(weak_manifest(folder).read_text())
    [incident]
    id = "x"
    <BLANKLINE>
    [detection]
    latency_factor = 0.99
    min_prompt_tokens = 1024
    overlap_window = "15m"
    <BLANKLINE>
    """
    lines = (case / "case.toml").read_text().splitlines()
    if "[detection]" not in lines:
        lines.append("[detection]")
    keep = [line for line in lines if line.split("=")[0].strip() not in WEAK_DETECTION]
    at = keep.index("[detection]") + 1
    keep[at:at] = [f"{key} = {value}" for key, value in WEAK_DETECTION.items()]
    path = case / "case.weak.toml"
    path.write_text("\n".join(keep) + "\n")
    return path


def fresh(case: Path) -> None:
    """Remove the case database (and its spill folder) and any earlier report."""
    for name in ("case.duckdb", "case.duckdb.wal", "case.weak.toml"):
        (case / name).unlink(missing_ok=True)
    shutil.rmtree(case / "case.duckdb.tmp", ignore_errors=True)
    shutil.rmtree(case / "report", ignore_errors=True)


def run_case(case: Path, fmt: str, stages: tuple[str, ...], args, peer: bool) -> dict:
    """Floor, peer and the forensics stages on one case folder."""
    row: dict = {"format": fmt, "stages": {}}
    limit = ["--memory-limit", args.memory_limit] if args.memory_limit else []

    def step(name: str, cmd: list[str]) -> bool:
        result = measure(cmd, args.timeout)
        output = result.pop("output")
        row["stages"][name] = result
        shown = f"{result['seconds']:8.1f} s {result['peak_rss_mb']:7,} MB"
        print(f"  {fmt:7s} {name:7s} {shown}  {result['outcome']}", flush=True)
        if result["outcome"] != "ok":
            print(f"    {result['last_line']}", flush=True)
            return False
        if name in ("floor", "peer"):
            row[name + "_result"] = json.loads(output.strip().splitlines()[-1])
        return True

    refs = [sys.executable, str(HERE / "references.py")]
    step("floor", refs + ["floor", str(case), fmt])
    if peer:
        step("peer", refs + ["peer", str(case)])
    fresh(case)
    # Each of ingest, detect and report needs the ones before it: the chain runs up to the
    # last one chosen.
    order = ("ingest", "detect", "spark", "report")
    chain = [s for s in order if s in stages]
    chain = list(order[: len(chain) and 1 + order.index(chain[-1])])
    missing = spark_missing()
    if "spark" in chain and (missing or "spark" not in stages):
        if "spark" in stages:
            print(f"  {fmt:7s} spark   skipped: {missing}", flush=True)
        chain.remove("spark")
    ok = True
    for stage in chain:
        if ok:
            engine = ["--engine", "spark", "--spark-master", SPARK_MASTER]
            cmd = [str(FORENSICS), "detect" if stage == "spark" else stage, str(case)]
            ok = step(stage, cmd + limit + (engine if stage == "spark" else []))
            if stage in ("detect", "spark") and ok:
                row["found" if stage == "detect" else "found_spark"] = counts(case / "case.duckdb")
    if ok and "weak" in stages and "report" in chain:
        # The same database again, a weak signal firing on many requests: detection and
        # the report, timed as one stage each.
        weak = str(weak_manifest(case))
        if step("weak_detect", [str(FORENSICS), "detect", weak] + limit):
            row["found_weak"] = counts(case / "case.duckdb")
            step("weak_report", [str(FORENSICS), "report", weak] + limit)
    if "run" in stages:
        fresh(case)
        if step("run", [str(FORENSICS), "run", str(case)] + limit) and "found" not in row:
            row["found"] = counts(case / "case.duckdb")
    fresh(case)
    return row


def spark_missing() -> str | None:
    """Why the Spark stage cannot run here (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        return 'no pyspark (pip install -e ".[spark]")'
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime"
    return None


def growth(rows: list[dict]) -> None:
    """Per stage and format: the factor each doubling of requests multiplied the time by."""
    last: dict[tuple[str, str], tuple[int, float]] = {}
    for row in rows:
        row["growth_per_doubling"] = {}
        for name, r in row["stages"].items():
            if r["outcome"] != "ok":
                continue
            key = (row["format"], name)
            if key in last and last[key][0] < row["requests"]:
                n0, t0 = last[key]
                doublings = math.log2(row["requests"] / n0)
                row["growth_per_doubling"][name] = round((r["seconds"] / t0) ** (1 / doublings), 2)
            last[key] = (row["requests"], r["seconds"])


def ratios(rows: list[dict]) -> None:
    """Per stage: its time over the floor's (same format) and over the peer's (same size)."""
    peers = {r["requests"]: r["stages"]["peer"] for r in rows if "peer" in r["stages"]}
    for row in rows:
        floor_ = row["stages"].get("floor")
        peer = peers.get(row["requests"])
        row["ratios"] = {}
        for name in STAGES:
            r = row["stages"].get(name)
            if r is None or r["outcome"] != "ok":
                continue
            row["ratios"][name] = {
                ref: round(r["seconds"] / base["seconds"], 2)
                for ref, base in (("floor", floor_), ("peer", peer))
                if base is not None and base["outcome"] == "ok"
            }


def _cell(stage: dict | None) -> str:
    if stage is None:
        return "-"
    if stage["outcome"] != "ok":
        return stage["outcome"].split(" (")[0].replace("killed by signal", "killed")
    return f"{stage['seconds']:.1f}s/{stage['peak_rss_mb'] / 1024:.1f}G"


def table(rows: list[dict], peers: dict[int, dict]) -> str:
    """The one table: rows, time/peak RSS per stage, ratios, growth per doubling."""
    head = (
        f"{'requests':>9} {'format':7} {'rows':>6} {'floor':>11} {'peer':>11} "
        f"{'ingest':>12} {'detect':>12} {'spark':>12} {'report':>12} {'run':>12} "
        f"{'ingest/floor':>12} {'run/floor':>9} {'run/peer':>8} {'RSS/peer':>8} "
        f"{'spark/detect':>12}  growth/doubling i d s r run"
    )
    lines = [head]
    for row in rows:
        s = row["stages"]
        run, floor_ = s.get("run"), s.get("floor")
        peer = peers.get(row["requests"])
        ok = run is not None and run["outcome"] == "ok"

        def ratio(a, b):
            return f"{a / b:.1f}x" if a and b else "-"

        r_floor = ratio(run["seconds"], floor_ and floor_["seconds"]) if ok and floor_ else "-"
        ing = s.get("ingest")
        i_floor = "-"
        if ing and floor_ and ing["outcome"] == floor_["outcome"] == "ok":
            i_floor = ratio(ing["seconds"], floor_["seconds"])
        r_peer = r_rss = "-"
        if ok and peer and peer["outcome"] == "ok":
            r_peer = ratio(run["seconds"], peer["seconds"])
            r_rss = ratio(run["peak_rss_mb"], peer["peak_rss_mb"])
        detect, spark = s.get("detect"), s.get("spark")
        s_detect = "-"
        if detect and spark and detect["outcome"] == spark["outcome"] == "ok":
            s_detect = ratio(spark["seconds"], detect["seconds"])
        g = row.get("growth_per_doubling", {})
        grow = " ".join(f"{g[k]:.2f}" if k in g else "-" for k in GROWTH_COLUMNS)
        lines.append(
            f"{label(row['requests']):>9} {row['format']:7} {row['input_rows'] / 1e6:5.1f}M "
            f"{_cell(floor_):>11} {_cell(s.get('peer')):>11} "
            f"{_cell(s.get('ingest')):>12} {_cell(detect):>12} {_cell(spark):>12} "
            f"{_cell(s.get('report')):>12} {_cell(run):>12} "
            f"{i_floor:>12} {r_floor:>9} {r_peer:>8} {r_rss:>8} {s_detect:>12}  {grow}"
        )
    return "\n".join(lines)


def weak_lines(rows: list[dict]) -> list[str]:
    """One line per case measured with a weak signal: how many it called possible, and what
    detection and the report cost then against the same stages without it."""
    lines = []
    for row in rows:
        s = row["stages"]
        if "weak_report" not in s or "found_weak" not in row:
            continue
        lines.append(
            f"{label(row['requests']):>9} {row['format']:7} weak signal: "
            f"{row['found_weak']['possible']:,} possible "
            f"({row['found_weak']['possible'] / row['requests']:.1%} of requests); "
            f"detect {_cell(s['weak_detect'])} (without: {_cell(s.get('detect'))}), "
            f"report {_cell(s['weak_report'])} (without: {_cell(s.get('report'))})"
        )
    return lines


def machine() -> dict:
    import duckdb

    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "memory_mb": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(label(n) for n in LADDER))
    parser.add_argument("--small", action="store_true", help="200K requests, small fleet (CI)")
    parser.add_argument("--formats", default="parquet,jsonl")
    parser.add_argument(
        "--stages", default=",".join(STAGES), help="forensics stages to time (Parquet case)"
    )
    parser.add_argument("--jsonl-stages", choices=("ingest", "all"), default="ingest")
    parser.add_argument("--memory-limit", default=None, help="passed to every forensics stage")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per stage")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-peer", action="store_true", help="skip the pandas peer")
    parser.add_argument("--cache", type=Path, default=HERE / ".cache")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "latest.json")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows already in --out (a size and format measured again is replaced)",
    )
    parser.add_argument(
        "--show", action="store_true", help="print the table of --out, measuring nothing"
    )
    args = parser.parse_args(argv)
    if args.show:
        rows = json.loads(args.out.read_text())["rows"]
        growth(rows)
        ratios(rows)
        peers = {r["requests"]: r["stages"]["peer"] for r in rows if "peer" in r["stages"]}
        print(table(rows, peers))
        print("\n".join(weak_lines(rows)))
        return 0

    sizes = [SMALL] if args.small else sorted(parse_size(s) for s in args.sizes.split(","))
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    chosen = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    if set(chosen) - set(STAGES):
        parser.error(f"unknown stage(s) in {args.stages!r} (choose from {', '.join(STAGES)})")
    unknown = sorted(set(formats) - set(casegen.FORMATS))
    if unknown:
        parser.error(f"unknown format(s): {', '.join(unknown)} (choose from parquet, jsonl)")
    peer_ok = not args.no_peer
    if peer_ok:
        try:
            import pandas  # noqa: F401
        except ImportError:
            print("pandas is not installed (pip install -e '.[bench]'): no peer", flush=True)
            peer_ok = False

    started = datetime.now(UTC)
    rows: list[dict] = []
    if args.append and args.out.exists():
        rows = json.loads(args.out.read_text())["rows"]
    peers = {r["requests"]: r["stages"]["peer"] for r in rows if "peer" in r["stages"]}
    for requests in sizes:
        folder = ensure_case(
            args.cache, requests, args.seed, args.small, args.timeout, tuple(formats)
        )
        meta = json.loads((folder / "meta.json").read_text())
        print(f"{label(requests)} requests ({folder.name}):", flush=True)
        for fmt in formats:
            stages = chosen if fmt == "parquet" or args.jsonl_stages == "all" else ("ingest",)
            row = run_case(folder / fmt, fmt, stages, args, peer_ok and fmt == "parquet")
            row["requests"] = requests
            row["input_rows"] = sum(meta[k] for k in casegen.KINDS)
            row["input_bytes"] = meta["bytes"][fmt]
            row["planted_affected"] = meta["affected"]
            row["generator_version"] = meta.get("generator_version", 1)
            if "peer" in row["stages"]:
                peers[requests] = row["stages"]["peer"]
            for old in [r for r in rows if (r["requests"], r["format"]) == (requests, fmt)]:
                # Measured again: the new figures replace the old, stages not run now stay,
                # unless they were measured on another generator's case (another traffic).
                rows.remove(old)
                if old.get("generator_version", 1) == row["generator_version"]:
                    row = {**old, **row, "stages": {**old["stages"], **row["stages"]}}
            rows.append(row)
            rows.sort(key=lambda r: (r["requests"], r["format"] != "parquet"))
            growth(rows)
            ratios(rows)
            write(args.out, started, args, rows)
    print()
    print(table(rows, peers))
    print("\n".join(weak_lines(rows)))
    differ = []
    for row in rows:
        if "found" in row:
            f = row["found"]
            print(
                f"{label(row['requests'])} {row['format']}: {f['affected']:,} affected found "
                f"({row['planted_affected']:,} planted), {f['exposures']:,} exposures"
            )
            if "found_spark" in row:
                # A Spark figure kept by --append may predate a count added since: compare
                # what both sides counted.
                both = row["found_spark"].keys() & f.keys()
                agree = all(row["found_spark"][k] == f[k] for k in both)
                same = "the same" if agree else "NOT the same"
                print(f"  on Spark: {same} ({row['found_spark']})")
                if not agree:
                    differ.append(row["requests"])
    print(f"written: {args.out}")
    failed = [
        (row["requests"], row["format"], name)
        for row in rows
        for name, r in row["stages"].items()
        if r["outcome"] != "ok"
    ]
    # In the small mode CI runs, Spark finding other than DuckDB fails it like a failed stage.
    return 1 if (failed or differ) and args.small else 0


def write(out: Path, started: datetime, args, rows: list[dict]) -> None:
    """The results so far (rewritten after every case, so a long run leaves what it measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "generator_version": casegen.GENERATOR_VERSION,
        "mode": "small" if args.small else "ladder",
        "memory_limit": args.memory_limit,
        "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
