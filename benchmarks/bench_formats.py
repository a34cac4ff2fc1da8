"""Ingest speed of each real log format against canonical JSON Lines, for the same rows.

One simulated case is written canonical and as an SGLang fleet's logs with OTLP/JSON spans and
a LiteLLM spend log (``forensics simulate --format``). Its client requests are loaded from
canonical gzipped JSON Lines, from OTLP/JSON and from LiteLLM CSV; its engine legs from
canonical gzipped JSON Lines (written from the simulator's Parquet: the same rows, one file per
node like the logs) and from the SGLang logs. Each load goes into a fresh database, best of
``--repeat`` runs. Prints rows, seconds, rows per second and the ratio to canonical; exits 1
when a format is slower than ``--limit`` times canonical.

Usage::

    .venv/bin/python benchmarks/bench_formats.py [--requests 100000] [--repeat 3] [--limit 2]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path


def _load(files: list[Path], kind: str, fmt: str, role: str | None) -> tuple[int, float]:
    """Rows loaded and wall seconds for loading ``files`` into a fresh in-memory database."""
    from forensics.db import connect
    from forensics.ingest import ingest_file

    con = connect(":memory:")
    try:
        started = time.perf_counter()
        rows = sum(
            ingest_file(con, f, kind, fmt, defaults={"role": role} if role else None).rows_loaded
            for f in files
        )
        return rows, time.perf_counter() - started
    finally:
        con.close()


def _legs_as_jsonl(folder: Path) -> list[Path]:
    """The canonical engine legs again as gzipped JSON Lines, one file per node like the
    engine logs (the baseline: same rows, same number of files)."""
    import polars as pl

    legs = pl.concat(
        [pl.read_parquet(p) for p in sorted((folder / "evidence").glob("engine_legs-*.parquet"))]
    )
    legs = legs.with_columns(
        [pl.col(c).dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ") for c in ("started_at", "finished_at")]
    )
    paths = []
    for (node,), part in sorted(legs.partition_by("node", as_dict=True).items()):
        path = folder / "evidence" / f"engine_legs-{node}.jsonl.gz"
        path.write_bytes(gzip.compress(part.write_ndjson().encode(), compresslevel=3))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limit", type=float, default=2.0)
    args = parser.parse_args(argv)

    from forensics.simulate import simulate_case

    with tempfile.TemporaryDirectory(prefix="kv-bench-formats-") as tmp:
        base = Path(tmp)
        for fmt in ("canonical", "otel", "litellm"):
            simulate_case(base / fmt, requests=args.requests, seed=args.seed, fmt=fmt)
        ev = {fmt: base / fmt / "evidence" for fmt in ("canonical", "otel", "litellm")}
        logs = ev["otel"] / "sglang"
        runs = [
            ("requests", "canonical", sorted(ev["canonical"].glob("requests-*.jsonl.gz")), None),
            ("requests", "otel", sorted((ev["otel"] / "otel").glob("*.jsonl.gz")), None),
            ("requests", "litellm", sorted((ev["litellm"] / "litellm").glob("*.csv.gz")), None),
            ("engine_legs", "canonical", _legs_as_jsonl(base / "canonical"), None),
            ("engine_legs", "sglang", sorted(logs.glob("prefill-*.log.gz")), "prefill"),
            ("engine_legs", "sglang", sorted(logs.glob("decode-*.log.gz")), "decode"),
        ]
        # Rounds over every run, best of each: a busy machine slows all formats alike.
        best: dict[int, tuple[int, float]] = {}
        for _ in range(args.repeat):
            for i, (kind, fmt, files, role) in enumerate(runs):
                rows, seconds = _load(files, kind, fmt, role)
                if i not in best or seconds < best[i][1]:
                    best[i] = (rows, seconds)
        timed: dict[tuple[str, str], list[float]] = {}
        for i, (kind, fmt, _, _) in enumerate(runs):
            entry = timed.setdefault((kind, fmt), [0, 0.0])
            entry[0] += best[i][0]
            entry[1] += best[i][1]
    failed = False
    print(
        f"{'kind':<12} {'format':<10} {'rows':>9} {'seconds':>8} {'rows/s':>10} {'x canonical':>11}"
    )
    for (kind, fmt), (rows, seconds) in timed.items():
        rate = rows / seconds
        base_rows, base_seconds = timed[(kind, "canonical")]
        ratio = (seconds / rows) / (base_seconds / base_rows)
        failed |= ratio > args.limit
        print(f"{kind:<12} {fmt:<10} {rows:>9,} {seconds:>8.2f} {rate:>10,.0f} {ratio:>11.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
