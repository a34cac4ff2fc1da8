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

from forensics.report.data import affected_rows, iso, utc
from forensics.sql import first_row

if TYPE_CHECKING:
    import duckdb

    from forensics.report.data import ReportData
    from forensics.report.redact import Redactor

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


def _event_key(e: dict) -> tuple[str, str, str]:
    return (e["datetime"], e["kind"], e["message"])


def timesketch_events(
    con: duckdb.DuckDBPyConnection, data: ReportData, red: Redactor
) -> Iterator[dict]:
    """The case timeline as Timesketch events (``message``, ``datetime``, ``timestamp_desc``).

    Every affected response (with its verdict and whether excluded traffic received it), the
    manifest's events (the fix marked), configuration changes from the pool snapshots, and the
    first and last request each exclusion rule matched among the affected responses. Sorted
    by time, then kind, then message. The affected responses stream from the database and are
    merged with the few other events, so the export costs no more memory for a large incident.
    """
    import heapq

    others: list[dict] = []
    for e in data.timeline:
        if e["source"] == "findings" or e["at"] is None:
            continue
        kind = "configuration_change" if e["source"] == "pool snapshots" else "case_event"
        if e.get("fix"):
            kind = "fix"
        others.append(
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
        first, last = first_row(
            con,
            """SELECT min(received_at), max(received_at) FROM findings_affected
               WHERE received_at IS NOT NULL
                 AND list_contains(string_split(coalesce(excluded_by, ''), ','), $name)""",
            {"name": rule["name"]},
        )
        for label, at in (("first", first), ("last", last)):
            if at is not None:
                others.append(
                    {
                        "message": f"Exclusion {rule['name']!r} ({rule['reason']}): {label}"
                        f" affected response it matched; rule {rule['rule']}",
                        "datetime": iso(utc(at)),
                        "timestamp_desc": "Request received",
                        "kind": "exclusion",
                    }
                )
    others.sort(key=_event_key)
    yield from heapq.merge(_affected_events(con, red), others, key=_event_key)


def _affected_events(con: duckdb.DuckDBPyConnection, red: Redactor) -> Iterator[dict]:
    """One event per affected response, in the export's order. The rows come in arrival
    order; within one second the order of the written timestamps (a whole second sorts after
    its fractions) is restored by sorting that second's events."""
    second: str | None = None
    group: list[dict] = []
    for a in affected_rows(con, red):
        if a["received_at"] is None:
            continue
        who = a["tenant_id"] or "unknown tenant"
        note = f" (excluded traffic: {a['excluded_by']})" if a["excluded_by"] else ""
        limit = f" against a limit of {a['threshold_tokens']:,}" if a["threshold_tokens"] else ""
        event = {
            "message": f"Affected response {a['request_id']} to {who}: {a['verdict']}"
            f" ({a['signals']}), prompt {a['prompt_tokens']:,} tokens" + limit + note,
            "datetime": iso(a["received_at"]),
            "timestamp_desc": "Request received",
            "kind": "affected_response",
            "request_id": a["request_id"],
            "tenant_id": a["tenant_id"],
            "verdict": a["verdict"],
            "excluded_by": a["excluded_by"],
        }
        if event["datetime"][:19] != second and group:
            yield from sorted(group, key=_event_key)
            group = []
        second = event["datetime"][:19]
        group.append(event)
    yield from sorted(group, key=_event_key)


def timesketch_jsonl(
    con: duckdb.DuckDBPyConnection, data: ReportData, red: Redactor
) -> Iterator[str]:
    """The Timesketch events as JSON Lines (keys sorted, so the bytes are reproducible), one
    line at a time."""
    for e in timesketch_events(con, data, red):
        yield json.dumps({k: v for k, v in e.items() if v is not None}, sort_keys=True) + "\n"


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
