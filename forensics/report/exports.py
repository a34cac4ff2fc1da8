"""Exports for the tools responders already use: a Timesketch timeline and Parquet findings.

The timeline is built from the loaded (and, when asked, redacted) report data, so it never
holds a tenant id a redacted report would hide. The Parquet files copy the findings tables as
they are, tenant ids included, so they are written only for an unredacted report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.report.data import iso

if TYPE_CHECKING:
    import duckdb

    from forensics.report.data import ReportData

# Findings tables exported as Parquet, each with the order that makes its bytes reproducible.
PARQUET_TABLES = {
    "findings_affected": "received_at, request_id",
    "findings_exposures": "recipient_request_id, source_request_id, method, source_tenant_id",
    "findings_signals": "request_id, signal, detector_id",
    "findings_attribution": "recipient_request_id",
    "findings_notifications": "tenant_id, role",
    "findings_review": "tenant_id NULLS FIRST, role",
    "findings_exploitation": "tenant_id",
    "findings_excluded": "request_id, exclusion",
}


def timesketch_events(data: ReportData) -> Iterator[dict]:
    """The case timeline as Timesketch events (``message``, ``datetime``, ``timestamp_desc``).

    Every affected response (with its verdict and whether excluded traffic received it), the
    manifest's events (the fix marked), configuration changes from the pool snapshots, and the
    first and last request each exclusion rule matched among the affected responses. Sorted
    by time, then kind, then message.
    """
    events: list[dict] = []
    for a in data.affected:
        if a["received_at"] is None:
            continue
        who = a["tenant_id"] or "unknown tenant"
        note = f" (excluded traffic: {a['excluded_by']})" if a["excluded_by"] else ""
        events.append(
            {
                "message": f"Affected response {a['request_id']} to {who}: {a['verdict']}"
                f" ({a['signals']}), prompt {a['prompt_tokens']:,} tokens"
                + (
                    f" against a limit of {a['threshold_tokens']:,}"
                    if a["threshold_tokens"]
                    else ""
                )
                + note,
                "datetime": iso(a["received_at"]),
                "timestamp_desc": "Request received",
                "kind": "affected_response",
                "request_id": a["request_id"],
                "tenant_id": a["tenant_id"],
                "verdict": a["verdict"],
                "excluded_by": a["excluded_by"],
            }
        )
    for e in data.timeline:
        if e["source"] == "findings" or e["at"] is None:
            continue
        kind = "configuration_change" if e["source"] == "pool snapshots" else "case_event"
        if e.get("fix"):
            kind = "fix"
        events.append(
            {
                "message": e["event"],
                "datetime": iso(e["at"]),
                "timestamp_desc": "Pool snapshot observed"
                if kind == "configuration_change"
                else "Case timeline",
                "kind": kind,
            }
        )
    for rule in data.exclusions:
        times = sorted(
            a["received_at"]
            for a in data.affected
            if a["received_at"] is not None and rule["name"] in (a["excluded_by"] or "").split(",")
        )
        for label, at in (("first", times[:1]), ("last", times[-1:])):
            for t in at:
                events.append(
                    {
                        "message": f"Exclusion {rule['name']!r} ({rule['reason']}): {label}"
                        f" affected response it matched; rule {rule['rule']}",
                        "datetime": iso(t),
                        "timestamp_desc": "Request received",
                        "kind": "exclusion",
                    }
                )
    events.sort(key=lambda e: (e["datetime"], e["kind"], e["message"]))
    yield from events


def timesketch_jsonl(data: ReportData) -> str:
    """The Timesketch events as JSON Lines (keys sorted, so the bytes are reproducible)."""
    return "".join(
        json.dumps({k: v for k, v in e.items() if v is not None}, sort_keys=True) + "\n"
        for e in timesketch_events(data)
    )


def write_findings_parquet(con: duckdb.DuckDBPyConnection, folder: Path) -> list[Path]:
    """Copy each findings table to ``folder/<table>.parquet``; returns the paths written.

    DuckDB writes each file (set-based, any size) under a temporary name in the same folder,
    which is made private and renamed when complete, like every other output; a table the
    database lacks is skipped.
    """
    import os

    import duckdb

    from forensics.errors import ForensicsError
    from forensics.files import PARTIAL_SUFFIX, make_private, private_dirs
    from forensics.readers import sql_str

    have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    private_dirs(folder)
    written = []
    for table, order in PARQUET_TABLES.items():
        if table not in have:
            continue
        path = folder / f"{table}.parquet"
        tmp = folder / f".{path.name}{PARTIAL_SUFFIX}"
        try:
            con.execute(
                f"COPY (SELECT * FROM {table} ORDER BY {order}) TO {sql_str(str(tmp))} "
                "(FORMAT parquet, COMPRESSION zstd)"
            )
            make_private(tmp)
            os.replace(tmp, path)
        except (duckdb.Error, OSError) as exc:
            tmp.unlink(missing_ok=True)
            first = str(exc).strip().splitlines()[0]
            raise ForensicsError(f"{path}: cannot write the file ({first})") from None
        written.append(path)
    return written
