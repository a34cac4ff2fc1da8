"""Detection at scale: simulate a case, ingest it, detect, and score against the truth.

    .venv/bin/python benchmarks/bench_detect.py --requests 1000000 --seed 5 [--out DIR]

Prints wall time of each stage (the allocator replay on its own line), peak memory, and
precision/recall against the simulator's truth. Sized for a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from forensics import attribution, detect
    from forensics.case import load_case
    from forensics.db import connect
    from forensics.evaluate import evaluate
    from forensics.ingest import ingest_case
    from forensics.simulate import simulate_case

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-detect-"))
    timings: dict[str, float] = {}

    t = time.perf_counter()
    sim = simulate_case(out, requests=args.requests, seed=args.seed)
    timings["simulate"] = time.perf_counter() - t
    case = load_case(sim.case_path)
    case.database.unlink(missing_ok=True)

    t = time.perf_counter()
    ingest_case(case)
    timings["ingest"] = time.perf_counter() - t

    # Time the replay on its own by wrapping it.
    replay_time = [0.0]
    original = attribution._replay

    def timed_replay(*a, **kw):
        start = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            replay_time[0] += time.perf_counter() - start

    attribution._replay = timed_replay
    con = connect(case.database)
    t = time.perf_counter()
    summary = detect.detect_case(con, case)
    timings["detect (all)"] = time.perf_counter() - t
    timings["  of which allocator replay"] = replay_time[0]
    requests = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    print(f"requests {requests:,}; verdicts {summary.verdicts}; exposures {summary.exposures:,}")
    for name, seconds in timings.items():
        print(f"{name:32s} {seconds:8.2f} s")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MiB")
    for line in evaluate(con, case.folder / "truth").lines():
        print(line)
    if args.out is None:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
