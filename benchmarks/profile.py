"""Where a forensics stage spends its time, on a case the benchmark cached (or any case).

Two views, both of a fresh process:

- ``frames``: samples ``forensics STAGE CASE`` with py-spy (``pip install py-spy``), idle
  threads included so time inside DuckDB counts, and prints the frames of this package with
  their inclusive share (``--top N``).
- ``statements``: runs detection in this process through a connection that times every SQL
  statement it is given, and prints the statements that took longest (summed over repeats,
  e.g. the per-rank queries of attribution).

The stage's database must be in the state the stage expects: ``forensics ingest CASE`` before
profiling detect, ``forensics detect CASE`` before profiling report. ``statements`` works on
a copy of the database, so the case is left as it was.

Usage::

    python benchmarks/profile.py frames CASE detect|report|ingest|run [--rate 25] [--top 40]
    python benchmarks/profile.py statements CASE [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORENSICS = Path(sys.executable).with_name("forensics")
PY_SPY = Path(sys.executable).with_name("py-spy")


def frames(case: Path, stage: str, rate: int, top: int) -> None:
    """Sample one stage with py-spy and print this package's frames by inclusive share."""
    spy = str(PY_SPY) if PY_SPY.exists() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="kv-profile-") as tmp:
        raw = Path(tmp) / "samples.txt"
        cmd = [spy, "record", "--idle", "-r", str(rate), "-f", "raw", "-o", str(raw), "--"]
        cmd += [str(FORENSICS), stage, str(case)]
        if stage in ("report", "run"):
            cmd += ["--out", str(Path(tmp) / "report")]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        inclusive: collections.Counter[str] = collections.Counter()
        total = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            total += int(count)
            for frame in dict.fromkeys(stack.split(";")):
                if "forensics/" in frame and "forensics/cli.py" not in frame:
                    inclusive[frame] += int(count)
    print(f"forensics {stage}: {wall:.1f} s wall, {total} samples at {rate} Hz")
    for frame, count in inclusive.most_common(top):
        print(f"{count / rate:8.1f} s {100 * count / max(total, 1):5.1f} %  {frame}")


class TimedConnection:
    """A DuckDB connection that adds up the time of each statement text it executes."""

    def __init__(self, con):
        self._con = con
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def execute(self, sql, *args, **kwargs):
        import inspect

        self._register(inspect.currentframe().f_back.f_locals)
        return self._timed(sql, lambda: self._con.execute(sql, *args, **kwargs))

    def sql(self, sql, *args, **kwargs):
        """A query run through ``sql`` (the detectors), timed in full: its rows are fetched
        here and handed back as a relation over them."""
        import inspect

        self._register(inspect.currentframe().f_back.f_locals)

        def run():
            relation = self._con.sql(sql, *args, **kwargs)
            return None if relation is None else relation.to_arrow_table()

        table = self._timed(sql, run)
        return None if table is None else self._con.from_arrow(table)

    def _register(self, caller) -> None:
        # Replacement scans resolve Arrow and DataFrame names in the caller's frame: register
        # the caller's tables so its SQL still finds them through this proxy.
        for name, value in caller.items():
            kind = type(value)
            if kind.__module__.split(".")[0] in ("pyarrow", "polars", "pandas") and (
                kind.__name__ in ("Table", "RecordBatch", "RecordBatchReader", "DataFrame")
            ):
                self._con.register(name, value)
            elif type(value).__name__ == "DuckDBPyRelation":
                value.create_view(name, replace=True)

    def _timed(self, sql, run):
        key = " ".join(str(sql).split())[:100]
        start = time.perf_counter()
        try:
            return run()
        finally:
            self.seconds[key] += time.perf_counter() - start
            self.calls[key] += 1

    def __getattr__(self, name):
        return getattr(self._con, name)


def statements(case: Path, top: int) -> None:
    """Run detection on a copy of the case database and print its slowest statements."""
    from forensics.case import load_case
    from forensics.db import connect
    from forensics.detect import detect_case

    loaded = load_case(case)
    with tempfile.TemporaryDirectory(prefix="kv-profile-") as tmp:
        copy = Path(tmp) / "case.duckdb"
        shutil.copy(loaded.database, copy)
        # Under the manifest's memory limit, as `forensics detect` runs it.
        con = TimedConnection(connect(copy, memory_limit=loaded.memory_limit))
        start = time.perf_counter()
        detect_case(con, loaded)
        wall = time.perf_counter() - start
        con.close()
    sql = sum(con.seconds.values())
    print(f"detect: {wall:.1f} s in process, {sql:.1f} s of it in SQL statements")
    for key, seconds in con.seconds.most_common(top):
        print(f"{seconds:8.2f} s {con.calls[key]:6d}x  {key}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="view", required=True)
    f = sub.add_parser("frames")
    f.add_argument("case", type=Path)
    f.add_argument("stage", choices=("ingest", "detect", "report", "run"))
    f.add_argument("--rate", type=int, default=25)
    f.add_argument("--top", type=int, default=40)
    s = sub.add_parser("statements")
    s.add_argument("case", type=Path)
    s.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if args.view == "frames":
        frames(args.case, args.stage, args.rate, args.top)
    else:
        statements(args.case, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
