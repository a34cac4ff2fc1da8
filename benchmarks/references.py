"""The two references every benchmark figure is divided by, each run in a process of its own.

``floor``: the cheapest possible pass over a case, DuckDB loading every column of every input
file once into an in-memory table (JSON Lines with the canonical column types given, so
nothing is sniffed). No tool that reads all the evidence can be faster on this machine.

``peer``: what a competent analyst's pandas notebook does for the two core questions, from the
Parquet files: over-pool flagging (``merge_asof`` by node of each request against the prefill
and decode pool snapshots in force at its arrival) and temporal source candidates (per decode
node, the releases within the overlap window before each flagged request, found with
``searchsorted``). It answers far less than ``forensics run`` (no engine-leg signals, no
replay, no report), so matching it is the least a tool should do.

Each prints one JSON line with its counts, so the harness can check both saw the same case.

Usage::

    python benchmarks/references.py floor CASE_DIR parquet|jsonl
    python benchmarks/references.py peer CASE_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KINDS = ("requests", "engine_legs", "pool_snapshots", "tenants")
OVERLAP_MINUTES = 15


def floor(case: Path, fmt: str) -> dict:
    """Load every input column once into memory with DuckDB; return the rows per kind."""
    import duckdb

    from forensics.schema import SQL_TYPE, columns

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    rows = {}
    for kind in KINDS:
        if fmt == "parquet":
            source = f"read_parquet('{case}/evidence/{kind}*.parquet')"
        else:
            types = ", ".join(f"'{c.name}': '{SQL_TYPE[c.type]}'" for c in columns(kind))
            source = (
                f"read_json('{case}/evidence/{kind}*.jsonl.gz', format = 'newline_delimited', "
                f"columns = {{{types}}})"
            )
        con.execute(f"CREATE TABLE {kind} AS SELECT * FROM {source}")
        rows[kind] = con.execute(f"SELECT count(*) FROM {kind}").fetchone()[0]
    return {"rows": rows}


def _read(case: Path, pattern: str, cols: list[str]):
    import pandas as pd

    files = sorted((case / "evidence").glob(pattern))
    return pd.concat([pd.read_parquet(f, columns=cols) for f in files], ignore_index=True)


def peer(case: Path) -> dict:
    """Over-pool flags and temporal candidates the way a pandas notebook computes them."""
    import numpy as np
    import pandas as pd

    req = _read(
        case,
        "requests*.parquet",
        [
            "request_id",
            "tenant_id",
            "received_at",
            "prompt_tokens",
            "http_status",
            "prefill_node",
            "decode_node",
        ],
    )
    snaps = _read(
        case,
        "pool_snapshots*.parquet",
        ["node", "observed_at", "role", "max_total_num_tokens", "max_req_input_len"],
    )
    releases = _read(case, "engine_legs-decode*.parquet", ["request_id", "node", "finished_at"])

    # Over-pool: the limit in force on the prefill node at arrival, the decode pool likewise.
    req = req.dropna(subset=["prefill_node", "decode_node"]).sort_values("received_at")
    pre = snaps[snaps.role == "prefill"].sort_values("observed_at")
    dec = snaps[snaps.role == "decode"].sort_values("observed_at")
    req = pd.merge_asof(
        req,
        pre[["node", "observed_at", "max_req_input_len"]],
        left_on="received_at",
        right_on="observed_at",
        left_by="prefill_node",
        right_by="node",
    ).drop(columns=["node", "observed_at"])
    req = pd.merge_asof(
        req,
        dec[["node", "observed_at", "max_total_num_tokens"]].rename(
            columns={"max_total_num_tokens": "decode_pool"}
        ),
        left_on="received_at",
        right_on="observed_at",
        left_by="decode_node",
        right_by="node",
    ).drop(columns=["node", "observed_at"])
    flagged = req[
        (req.prompt_tokens >= req.max_req_input_len)
        & req.http_status.between(200, 299)
        & (req.prompt_tokens <= req.decode_pool)
    ]

    # Temporal candidates: releases on the victim's decode node within the window before it.
    releases = releases.merge(req[["request_id", "tenant_id"]], on="request_id")
    window = np.timedelta64(OVERLAP_MINUTES * 60, "s")
    pairs = 0
    tenants: set[str] = set()
    by_node = {node: g.sort_values("finished_at") for node, g in releases.groupby("node")}
    for node, victims in flagged.groupby("decode_node"):
        rel = by_node.get(node)
        if rel is None:
            continue
        at = rel.finished_at.dt.tz_convert(None).to_numpy()
        t = victims.received_at.dt.tz_convert(None).to_numpy()
        lo = np.searchsorted(at, t - window, side="left")
        hi = np.searchsorted(at, t, side="left")
        source_tenant = rel.tenant_id.to_numpy()
        for v_tenant, a, b in zip(victims.tenant_id.to_numpy(), lo, hi, strict=True):
            others = source_tenant[a:b]
            others = others[others != v_tenant]
            pairs += len(others)
            tenants.update(others.tolist())
    return {"flagged": int(len(flagged)), "candidate_pairs": pairs, "source_tenants": len(tenants)}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("floor", "peer"):
        print("\n".join(__doc__.strip().splitlines()[-2:]), file=sys.stderr)
        return 2
    case = Path(argv[1]).resolve()
    if argv[0] == "floor":
        result = floor(case, argv[2] if len(argv) > 2 else "parquet")
    else:
        result = peer(case)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
