"""Detection, attribution and scoping against simulator truth, with evidence taken away.

For each seed, one simulated case is ingested once; each mode then detects and scopes on a
private copy of the database with some evidence removed:

- ``legs``: everything but the allocation log (allocator replay over engine legs);
- ``log``: everything (allocation log: exact);
- ``client``: no engine legs (replay over client times);
- ``decode10``: a tenth of the decode legs lost (a rank's replay mixes engine and client
  times);
- ``temporal``: no decode pool snapshots (temporal candidates only);
- ``lost10``: a tenth of the client records lost (their legs stay);
- ``engine``: no client records at all (engine records alone).

It prints, per mode, affected responses, notified source tenants, notified plus review
candidates, and (recipient response, source tenant) pairs: precision and recall of each.

    .venv/bin/python benchmarks/bench_accuracy.py --seeds 1-5 --requests 40000
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench_exploitation import seeds_arg  # run as a script: its folder is on sys.path

MODES = {
    "legs": ["DELETE FROM kv_allocations"],
    "log": [],
    "client": ["DELETE FROM kv_allocations", "DELETE FROM engine_legs"],
    "decode10": [
        "DELETE FROM kv_allocations",
        "DELETE FROM engine_legs WHERE role = 'decode' AND hash(request_id) % 10 = 0",
    ],
    "temporal": [
        "DELETE FROM kv_allocations",
        "DELETE FROM pool_snapshots WHERE coalesce(role, 'decode') = 'decode'",
    ],
    "lost10": [
        "DELETE FROM kv_allocations",
        "DELETE FROM requests WHERE hash(request_id) % 10 = 0",
    ],
    "engine": ["DELETE FROM kv_allocations", "DELETE FROM requests"],
}


def run_seed(folder: Path, seed: int, requests: int, modes: list[str]) -> dict[str, dict]:
    from forensics.case import load_case
    from forensics.db import connect
    from forensics.detect import detect_case
    from forensics.evaluate import evaluate
    from forensics.ingest import ingest_case
    from forensics.scope import scope_case
    from forensics.simulate import simulate_case

    simulate_case(folder / "case", requests=requests, seed=seed, kv_allocations=True)
    case = load_case(folder / "case" / "case.toml")
    ingest_case(case)
    out = {}
    for mode in modes:
        copy = folder / f"{mode}.duckdb"
        shutil.copy(case.database, copy)
        con = connect(copy)
        try:
            for statement in MODES[mode]:
                con.execute(statement)
            started = time.perf_counter()
            detect_case(con, case)
            scope_case(con, case)
            seconds = time.perf_counter() - started
            ev = evaluate(con, folder / "case" / "truth")
        finally:
            con.close()
            copy.unlink()
        out[mode] = {
            "affected": ev.affected,
            "notified sources": ev.notified_sources,
            "notified + review": ev.candidate_sources,
            "pairs": ev.source_pairs,
            "seconds": seconds,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for seed in seeds_arg(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_seed(Path(tmp), seed, args.requests, modes)
        for mode, scores in result.items():
            for name, s in scores.items():
                if name != "seconds" and s is not None:
                    t = totals[(mode, name)]
                    t[0] += s.true_positive
                    t[1] += s.false_positive
                    t[2] += s.false_negative
        print(f"seed {seed} done", file=sys.stderr)
    print(f"{len(seeds_arg(args.seeds))} seeds x {args.requests:,} requests (pooled counts)")
    print(f"{'mode':9s} {'figure':18s} {'precision':>9s} {'recall':>7s}   tp / fp / fn")
    for (mode, name), (tp, fp, fn) in totals.items():
        precision = tp / (tp + fp) if tp + fp else 1.0
        recall = tp / (tp + fn) if tp + fn else 1.0
        print(f"{mode:9s} {name:18s} {precision:9.3f} {recall:7.3f}   {tp} / {fp} / {fn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
