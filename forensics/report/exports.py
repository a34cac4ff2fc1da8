"""Exports for the tools responders already use: a Timesketch timeline and Parquet findings.

The timeline is built from the loaded (and, when asked, redacted) report data, so it never
holds a tenant id a redacted report would hide. The Parquet files copy the findings tables as
they are, tenant ids included, so they are written only for an unredacted report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.report import csvsql
from forensics.report.data import iso, utc
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


def _other_events(con: duckdb.DuckDBPyConnection, data: ReportData) -> list[dict]:
    """The events other than affected responses: the manifest's (the fix marked),
    configuration changes from the pool snapshots, and the first and last affected response
    each exclusion rule matched. A few, whatever the incident's size."""
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
    return sorted(others, key=_event_key)


def affected_event(
    request_id: str | None,
    tenant_id: str | None,
    received_at: Any,
    prompt_tokens: int | None,
    threshold_tokens: int | None,
    verdict: str | None,
    signals: str | None,
    excluded_by: str | None,
) -> dict:
    """The timeline event of one affected response (``tenant_id`` as the export shows it).

    The definition the export's SQL (:func:`_affected_lines_sql`) follows, and what it falls
    back to for a line that SQL cannot write as JSON itself; a test holds the two to the same
    bytes.

    >>> e = affected_event("r-1", None, "2026-09-01T10:00:00Z", 700000, 655360, "confirmed",
    ...                    "over_pool", None)
    >>> head, tail = e["message"].split(", prompt ")
    >>> head
    'Affected response r-1 to unknown tenant: confirmed (over_pool)'
    >>> tail
    '700,000 tokens against a limit of 655,360'
    """
    who = tenant_id or "unknown tenant"
    prompt = (
        f"prompt {prompt_tokens:,} tokens"
        if prompt_tokens is not None
        else "prompt of unknown length"
    )
    limit = f" against a limit of {threshold_tokens:,}" if threshold_tokens else ""
    note = f" (excluded traffic: {excluded_by})" if excluded_by else ""
    return {
        "message": f"Affected response {request_id} to {who}: {verdict} ({signals}), "
        + prompt
        + limit
        + note,
        "datetime": iso(received_at),
        "timestamp_desc": "Request received",
        "kind": "affected_response",
        "request_id": request_id,
        "tenant_id": tenant_id,
        "verdict": verdict,
        "excluded_by": excluded_by,
    }


def event_line(event: dict) -> str:
    """One event as a line of JSON: keys sorted (so the bytes are reproducible), no nulls."""
    return json.dumps({k: v for k, v in event.items() if v is not None}, sort_keys=True) + "\n"


# Text JSON writes as it is: printable ASCII but for the double quote and the backslash.
# Anything else (an id with a quote, a non-ASCII tenant name) is left to json.dumps.
_PLAIN_JSON = r"[ !#-\[\]-~]*"


def _affected_lines_sql(pseudonyms: bool) -> str:
    """Every affected response with a receive time as a timeline event, ordered among the
    other events (``__kv_events``: ``datetime``, ``kind``, ``message``, ``line``, ``n``):
    by time, kind and message, an affected response before another event of the same key
    (as :func:`heapq.merge` would), ties kept in arrival order.

    Columns: ``line`` (NULL where the text needs escaping), then what
    :func:`affected_event` takes to make it. With ``pseudonyms``, tenant ids are read from
    ``__kv_pseudonyms`` (``tenant_id``, ``pseudonym``).
    """
    tenant = "p.pseudonym" if pseudonyms else "a.tenant_id"
    join = "LEFT JOIN __kv_pseudonyms p ON p.tenant_id = a.tenant_id" if pseudonyms else ""

    def thousands(col: str) -> str:
        return f"format('{{:,}}', {col})"

    def text(col: str) -> str:
        # What an f-string writes for a value that may be None.
        return f"coalesce({col}, 'None')"

    message = (
        f"'Affected response ' || {text('a.request_id')} || ' to ' "
        f"|| coalesce(nullif({tenant}, ''), 'unknown tenant') || ': ' || {text('a.verdict')} "
        f"|| ' (' || {text('a.signals')} || '), ' "
        f"|| CASE WHEN a.prompt_tokens IS NULL THEN 'prompt of unknown length' "
        f"ELSE 'prompt ' || {thousands('a.prompt_tokens')} || ' tokens' END "
        f"|| CASE WHEN coalesce(a.threshold_tokens, 0) <> 0 "
        f"THEN ' against a limit of ' || {thousands('a.threshold_tokens')} ELSE '' END "
        f"|| CASE WHEN coalesce(a.excluded_by, '') <> '' "
        f"THEN ' (excluded traffic: ' || a.excluded_by || ')' ELSE '' END"
    )

    def member(key: str, col: str, last: bool = False) -> str:
        # A key and its value, omitted when NULL (as event_line omits None).
        pair = f"'\"{key}\": \"' || {col} || '\"'"
        pair = pair + " || ', '" if not last else "', ' || " + pair
        return f"CASE WHEN {col} IS NULL THEN '' ELSE {pair} END"

    # The message holds every text the line does (an empty tenant or exclusion name shows
    # as nothing), so a plain message means a plain line.
    line = (
        "'{\"datetime\": \"' || dt || '\", ' || "
        + member("excluded_by", "excluded_by")
        + ' || \'"kind": "affected_response", "message": "\' || message || \'", \' || '
        + member("request_id", "request_id")
        + " || "
        + member("tenant_id", "tenant_id")
        + ' || \'"timestamp_desc": "Request received"\' || '
        + member("verdict", "verdict", last=True)
        + " || '}' || chr(10)"
    )
    affected = f"""
        SELECT {csvsql.iso_sql("a.received_at")} AS dt, {message} AS message, a.request_id,
               {tenant} AS tenant_id, a.received_at, a.prompt_tokens, a.threshold_tokens,
               a.verdict, a.signals, a.excluded_by
        FROM findings_affected a {join}
        WHERE a.received_at IS NOT NULL"""
    # The line is made after the sort (a projection keeps the sorted order), so the sort
    # carries only the keys and the fields, not a line as long as all of them.
    return f"""
        SELECT CASE WHEN part = 1 THEN line
                    WHEN regexp_full_match(message, '{_PLAIN_JSON}') THEN {line} END AS line,
               request_id, tenant_id, received_at, prompt_tokens, threshold_tokens, verdict,
               signals, excluded_by
        FROM (
          SELECT NULL AS line, dt, 'affected_response' AS kind, message, 0 AS part,
                 received_at, request_id, NULL::BIGINT AS n, tenant_id, prompt_tokens,
                 threshold_tokens, verdict, signals, excluded_by
          FROM ({affected})
          UNION ALL
          SELECT line, datetime, kind, message, 1, NULL, NULL, n, NULL, NULL, NULL, NULL, NULL,
                 NULL
          FROM __kv_events
          ORDER BY dt, kind, message, part, received_at, request_id, n)"""


def timesketch_jsonl(
    con: duckdb.DuckDBPyConnection, data: ReportData, red: Redactor
) -> Iterator[str]:
    """The case timeline as Timesketch events, one JSON object a line (``message``,
    ``datetime``, ``timestamp_desc``, ``kind``), in chunks of lines.

    Every affected response (with its verdict and whether excluded traffic received it), the
    manifest's events (the fix marked), configuration changes from the pool snapshots, and the
    first and last request each exclusion rule matched among the affected responses; sorted by
    time, then kind, then message. The lines are made and ordered by the database and fetched
    in batches, so the export costs the same memory, and little Python, however many
    responses were affected.
    """
    import pyarrow as pa

    from forensics.db import cursor

    others = _other_events(con, data)
    cur = cursor(con)
    try:
        cur.register(
            "__kv_events",
            pa.table(
                {
                    "datetime": pa.array([e["datetime"] for e in others], pa.string()),
                    "kind": pa.array([e["kind"] for e in others], pa.string()),
                    "message": pa.array([e["message"] for e in others], pa.string()),
                    "line": pa.array([event_line(e) for e in others], pa.string()),
                    "n": pa.array(range(len(others)), pa.int64()),
                }
            ),
        )
        if red.active:
            csvsql.register_pseudonyms(
                cur, "SELECT tenant_id FROM findings_affected", ["tenant_id"], red
            )
        cur.execute(_affected_lines_sql(pseudonyms=red.active))
        while batch := cur.fetchmany(csvsql.BATCH_LINES):
            yield "".join(
                row[0] if row[0] is not None else event_line(affected_event(*row[1:]))
                for row in batch
            )
    finally:
        cur.close()


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
