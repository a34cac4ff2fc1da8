"""LiteLLM proxy spend logs (``LiteLLM_SpendLogs`` exported as CSV or JSON) -> ``requests``.

A CSV export has the table's columns as its header (JSON columns such as ``metadata`` hold
JSON text); a JSON export is one row object per line, or one array of row objects (pretty-
printed or not), where ``metadata`` is an object or a string holding one.

Mapping: ``request_id``; the tenant from ``tenant_field`` (a column, or ``metadata.<key>``),
by default ``team_id``, else ``metadata.user_api_key_team_id``; ``startTime`` (naive times are
the case's zone), ``completionStartTime`` (first token), ``endTime``; ``prompt_tokens``,
``completion_tokens``, the cached tokens of ``metadata.additional_usage_values``; the HTTP
status from ``metadata.error_information.error_code``, else 200 for ``status = success``;
``model_group`` (else ``model``); ``api_key`` (the hashed key); ``requester_ip_address``; the
first choice's finish reason in ``response``. Keys of ``metadata.spend_logs_metadata`` named
like a canonical column (``prefill_node``, ``decode_node``, ``dp_rank``, ``bootstrap_room``,
``user_agent``) fill it. Every other column is kept in ``extra``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forensics.adapters.documents import elements, field, fields
from forensics.adapters.records import adapted, nothing, open_records, without
from forensics.errors import EvidenceError
from forensics.readers import detect_type, sql_str
from forensics.readers import open_source as open_canonical

if TYPE_CHECKING:
    import duckdb

    from forensics.adapters import Options
    from forensics.readers import ByteProgress, Source

KINDS = ("requests",)
TENANT_KINDS = ("requests",)
_BY_NAME = ("prefill_node", "decode_node", "dp_rank", "bootstrap_room", "user_agent")
_MAPPED = [
    "request_id",
    "team_id",
    "startTime",
    "completionStartTime",
    "endTime",
    "prompt_tokens",
    "completion_tokens",
    "model_group",
    "model",
    "api_key",
    "requester_ip_address",
    "status",
    "request_duration_ms",
]


def sniff(text: str) -> str | None:
    """Why ``text`` (a file's first bytes) is a LiteLLM spend log export, or None."""
    markers = ("startTime", "call_type", "spend")
    if all(m in text for m in markers) and "request_id" in text:
        return "a LiteLLM spend log export (request_id, call_type, spend, startTime)"
    return None


def _records(con, path: Path, tag: str, progress) -> tuple[Source, str]:
    """The export's rows as ``(__kv_row, __kv_line, __rec)``, ``__rec`` a JSON object."""
    try:
        csv = detect_type(path)[0] == "csv"
    except EvidenceError:
        csv = False
    table = f"__kv_litellm_{tag}"
    if csv:
        base = open_canonical(con, path, tag, progress)
        if base.empty:
            return base, table
        pairs = ", ".join(f"{sql_str(n)}, {e}" for n, (e, _) in base.columns.items())
        con.execute(
            f"CREATE TEMP TABLE {table} AS SELECT {base.row_expr} AS __kv_row, "
            f"{base.raw_expr} AS __kv_line, json_object({pairs}) AS __rec, NULL AS __why "
            f"FROM {base.relation}"
        )
    else:
        base = open_records(con, path, tag, progress)
        if base.empty:
            return base, table
        # An array document: its elements are the rows, numbered from 1.
        con.execute(
            f"CREATE TEMP TABLE {table} AS SELECT CASE WHEN item = 0 THEN line ELSE item END "
            "AS __kv_row, text AS __kv_line, doc AS __rec, why AS __why "
            f"FROM {elements(base.relation)}"
        )
    base.cleanup.append(table)
    return base, table


def open_source(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    kind: str,
    tag: str,
    progress: ByteProgress | None,
    options: Options,
) -> Source:
    """A LiteLLM spend log export as requests."""
    base, records = _records(con, path, tag, progress)
    if base.empty:
        return nothing(base)
    tf = options.tenant_field
    top = [*_MAPPED, "metadata", "response"]
    meta = [
        "user_api_key_team_id",
        "error_information.error_code",
        "additional_usage_values.prompt_tokens_details.cached_tokens",
        "requester_ip_address",
        *(f"spend_logs_metadata.{name}" for name in _BY_NAME),
    ]
    if tf and tf.startswith("metadata."):
        meta.append(tf.removeprefix("metadata."))
    elif tf and tf not in top:
        top.append(tf)
    # Every field read once per row, into columns (one parse of the row, one of its metadata).
    read, named = fields("__rec", top)
    metas = "[" + ", ".join(sql_str("$." + p) for p in meta) + "]"
    table = f"{records}_fields"
    con.execute(
        f"""CREATE TEMP TABLE {table} AS
    WITH f AS (SELECT *, {read} FROM {records}),
    m AS (
      SELECT *, __f[{top.index("metadata") + 1}] AS __meta,
        __f[{top.index("response") + 1}] AS __response
      FROM f
    )
    SELECT __kv_row, __kv_line, __why, __rec, {named},
      CASE WHEN json_valid(__meta) THEN json_extract_string(__meta, {metas}) END AS __m,
      CASE WHEN json_valid(__response)
        THEN json_extract_string(__response, '$.choices[0].finish_reason') END AS __finish
    FROM m"""
    )
    base.cleanup.append(table)

    col = field

    def m(path: str) -> str:
        return f"nullif(__m[{meta.index(path) + 1}], '')"

    if tf is None:
        tenant = f"coalesce({col('team_id')}, {m('user_api_key_team_id')})"
    elif tf.startswith("metadata."):
        tenant = m(tf.removeprefix("metadata."))
    else:
        tenant = col(tf)
    status = f"lower({col('status')})"
    columns = {
        "request_id": col("request_id"),
        "tenant_id": tenant,
        "received_at": col("startTime"),
        "prompt_tokens": col("prompt_tokens"),
        "http_status": f"coalesce({m('error_information.error_code')}, "
        f"CASE WHEN {status} = 'success' THEN '200' END)",
        "completion_tokens": col("completion_tokens"),
        "cached_tokens": m("additional_usage_values.prompt_tokens_details.cached_tokens"),
        "first_token_at": col("completionStartTime"),
        "completed_at": col("endTime"),
        "e2e_ms": col("request_duration_ms"),
        "finish_reason": "__finish",
        "model": f"coalesce({col('model_group')}, {col('model')})",
        "api_key_id": col("api_key"),
        "client_ip": f"coalesce({col('requester_ip_address')}, {m('requester_ip_address')})",
    }
    for name in _BY_NAME:
        columns[name] = m(f"spend_logs_metadata.{name}")
    rest = without("__rec", [*_MAPPED, *([tf] if tf and "." not in tf else [])])
    why = (
        f"coalesce(__why, CASE WHEN {status} = 'failure' AND {m('error_information.error_code')} "
        "IS NULL THEN 'a failed request without metadata.error_information.error_code: the "
        "HTTP status the client got is not in the log' END)"
    )
    return adapted(base, table, columns, pre_error=why, extra=f"CAST({rest} AS JSON)")
