"""Time ``forensics simulate`` at scale.

Usage::

    .venv/bin/python benchmarks/bench_simulate.py [--requests 1000000] [--seed 0]
        [--kv-allocations] [--probers binary_search,sweep,repeat,slow] [--keep DIR]

Writes the case into a temporary folder (or ``--keep DIR``) and prints the wall time, the
throughput and the headline counts. The case itself is deterministic; only the time varies.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-allocations", action="store_true")
    parser.add_argument("--probers", default="", help="prober strategies, comma-separated")
    parser.add_argument("--keep", type=Path, default=None, help="write the case here and keep it")
    args = parser.parse_args()

    from forensics.simulate import simulate_case

    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-simulate-"))
    try:
        t0 = time.perf_counter()
        s = simulate_case(
            folder,
            requests=args.requests,
            seed=args.seed,
            kv_allocations=args.kv_allocations,
            probers=args.probers,
        )
        elapsed = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(
        f"simulate: {s.requests:,} requests in {elapsed:.1f} s "
        f"({s.requests / elapsed:,.0f} requests/s), {size / 1e6:.0f} MB written, "
        f"kv_allocations={'on' if args.kv_allocations else 'off'}"
    )
    print(
        f"affected {s.affected} ({s.affected_excluded} excluded), exposures {s.exposures:,}, "
        f"customer recipients {s.recipient_tenants}, source tenants {s.source_tenants}"
    )
    if s.probers:
        print("probers: " + ", ".join(f"{k} {v:,} requests" for k, v in s.probers.items()))


if __name__ == "__main__":
    main()
