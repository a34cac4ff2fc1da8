"""Cloudflare AI Gateway logs (the REST API's log listing) -> ``requests``.

What a responder saves from ``GET /accounts/{account_id}/ai-gateway/gateways/{gateway_id}/logs``:
pages of the listing, each ``{"success": ..., "errors": [...], "result": [<log>, ...],
"result_info": {...}}``, one page per file (pretty-printed or not) or one page per line; or the
logs alone, as one JSON array or one log object per line. A record is a log (``source_row``
counts logs in file order, across pages); a page with ``success: false`` is one record,
rejected with its first error message (its ``result`` is no listing); a page with an empty
``result`` holds no record.

Mapping: ``id`` (the gateway's log id); the tenant from custom ``metadata`` (an object, or, as
the REST API writes it, a string holding one): ``tenant_field`` names a metadata key, as
``metadata.<key>`` or just ``<key>`` (default ``tenant_id``), or a field of the log such as
``provider``; ``created_at`` (naive times are the case's zone); ``created_at + duration`` (ms)
as ``completed_at`` and ``duration`` as ``e2e_ms``; ``tokens_in``, ``tokens_out``,
``status_code``, ``model``. Metadata keys named like a canonical column (``prefill_node``,
``decode_node``, ``dp_rank``, ``bootstrap_room``, ``user_agent``, ``api_key_id``) fill it. Every
other field (``provider``, ``path``, ``cached``, ``cost``, ``step``, sizes and heads) and the
remaining metadata are kept in ``extra``.

A log with ``cached: true`` was answered from the gateway's response cache: no engine ran it,
so it held no KV cache and cannot be affected the way an engine response is; its answer is a
copy of an earlier response to the same request, which is judged where that one is logged.
Loading it would invent an engine request (detection replays requests without engine legs at
their client times, and a cache hit is always far too fast for its prompt), so it is rejected,
saying so; the rejects keep the whole log, so a responder can still find the customer who got
a copy of a response found affected.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forensics.adapters.documents import elements, field, fields
from forensics.adapters.records import adapted, nothing, open_records, without
from forensics.readers import sql_ident, sql_str

if TYPE_CHECKING:
    import duckdb

    from forensics.adapters import Options
    from forensics.readers import ByteProgress, Source

KINDS = ("requests",)
TENANT_KINDS = ("requests",)
DEFAULT_TENANT_KEY = "tenant_id"
# The fields of a log (workers-types ``AiGatewayLog``): a tenant_field of one of these names
# that field; any other name is a custom metadata key.
LOG_FIELDS = (
    "id",
    "provider",
    "model",
    "model_type",
    "path",
    "duration",
    "request_type",
    "request_content_type",
    "status_code",
    "response_content_type",
    "success",
    "cached",
    "tokens_in",
    "tokens_out",
    "metadata",
    "step",
    "cost",
    "custom_cost",
    "request_size",
    "request_head",
    "request_head_complete",
    "response_size",
    "response_head",
    "response_head_complete",
    "created_at",
)
_MAPPED = ["id", "created_at", "duration", "tokens_in", "tokens_out", "status_code", "model"]
# Canonical columns a custom metadata key of the same name fills.
_BY_NAME = ("prefill_node", "decode_node", "dp_rank", "bootstrap_room", "user_agent", "api_key_id")
# A time of day followed by Z or an offset: an instant; anything else is a wall-clock time.
_ZONED = "'[Tt ][0-9]{2}:[0-9]{2}.*([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$'"
CACHED = (
    "answered from the AI Gateway cache (cached: true), not by an engine: a copy of an earlier "
    "response to the same request"
)


def sniff(text: str) -> str | None:
    """Why ``text`` (a file's first bytes) is a Cloudflare AI Gateway log listing, or None."""
    markers = ('"created_at"', '"duration"', '"cached"', '"provider"')
    if all(m in text for m in markers):
        return "a Cloudflare AI Gateway log listing (created_at, duration, cached, provider)"
    return None


def tenant_source(tenant_field: str | None) -> tuple[str, str]:
    """Where the tenant is: ``("field", name)`` of the log or ``("metadata", key)``.

    >>> tenant_source(None)
    ('metadata', 'tenant_id')
    >>> tenant_source("metadata.team")
    ('metadata', 'team')
    >>> tenant_source("provider")
    ('field', 'provider')
    """
    name = tenant_field or DEFAULT_TENANT_KEY
    if name.startswith("metadata."):
        return "metadata", name.removeprefix("metadata.")
    return ("field", name) if name in LOG_FIELDS else ("metadata", name)


def _records(con, path: Path, tag: str, progress) -> tuple[Source, str]:
    """The file's logs as ``(__kv_row, __kv_line, __rec, __why)``, ``__rec`` a log object."""
    base = open_records(con, path, tag, progress)
    table = f"__kv_cloudflare_{tag}"
    if base.empty:
        return base, table
    # Lines -> the elements of an array document (else the line itself) -> the logs of a page
    # (else the element itself), each level numbered so the logs keep file order. A record
    # that is no log (a failed page, a page without a list, not an object) stays one row, to
    # be rejected; a page of no logs leaves no row.
    con.execute(
        f"""CREATE TEMP TABLE {table} AS
    WITH i AS {elements(base.relation)},
    d AS MATERIALIZED (
      SELECT line, item, doc, text, why, coalesce(json_exists(doc, '$.result'), false) AS page,
        json_type(doc, '$.result') AS rt,
        json_extract_string(doc, ['$.success', '$.errors[0].message', '$.errors[0].code']) AS p
      FROM i
    ),
    pages AS (
      SELECT *, page AND coalesce(lower(p[1]) = 'false', false) AS failed FROM d
    ),
    logs AS (
      SELECT line, item, generate_subscripts(from_json(doc -> '$.result', '["JSON"]'), 1) AS n,
        unnest(from_json(doc -> '$.result', '["JSON"]')) AS rec
      FROM pages WHERE page AND NOT failed AND rt = 'ARRAY'
    ),
    rows AS (
      SELECT line, item, n, rec::VARCHAR AS __kv_line,
        CASE WHEN json_type(rec) = 'OBJECT' THEN rec END AS __rec,
        CASE WHEN json_type(rec) <> 'OBJECT' THEN 'a log that is not a JSON object' END AS __why
      FROM logs
      UNION ALL
      SELECT line, item, 0, text, CASE WHEN why IS NULL AND NOT page THEN doc END,
        coalesce(why, CASE
          WHEN failed AND p[2] IS NULL THEN 'a failed page (success: false) without an error'
          WHEN failed THEN 'a failed page (success: false), first error: "' || p[2] || '"'
            || coalesce(' (code ' || p[3] || ')', '')
          WHEN page THEN 'a page whose result is not a list of logs' END)
      FROM pages WHERE NOT (page AND NOT failed AND rt IS NOT DISTINCT FROM 'ARRAY')
    )
    SELECT row_number() OVER (ORDER BY line, item, n) AS __kv_row, __kv_line, __rec, __why
    FROM rows"""
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
    """A Cloudflare AI Gateway log listing as requests."""
    base, records = _records(con, path, tag, progress)
    if base.empty:
        return nothing(base)
    where, tenant_name = tenant_source(options.tenant_field)
    top = [*_MAPPED, "cached", "metadata"]
    if where == "field" and tenant_name not in top:
        top.append(tenant_name)
    keys = [*_BY_NAME, *([tenant_name] if where == "metadata" else [])]
    # Every field read once per log, and the metadata (text either way) parsed once.
    read, named = fields("__rec", top)
    metas = "[" + ", ".join(sql_str("$." + sql_ident(k)) for k in keys) + "]"
    table = f"{records}_fields"
    con.execute(
        f"""CREATE TEMP TABLE {table} AS
    WITH f AS (SELECT *, {read} FROM {records}),
    m AS (
      SELECT *, coalesce(CASE WHEN json_valid(__meta) THEN json_type(__meta) = 'OBJECT' END,
        false) AS __meta_ok
      FROM (SELECT *, __f[{top.index("metadata") + 1}] AS __meta FROM f)
    )
    SELECT __kv_row, __kv_line, __why, __rec, __meta, __meta_ok, {named},
      CASE WHEN __meta_ok THEN json_extract_string(__meta, {metas}) END AS __m
    FROM m"""
    )
    base.cleanup.append(table)

    col = field

    def m(key: str) -> str:
        return f"nullif(__m[{keys.index(key) + 1}], '')"

    created = f"trim({col('created_at')})"
    shift = (
        f"to_microseconds(TRY_CAST(round(TRY_CAST({col('duration')} AS DOUBLE) * 1000) AS BIGINT))"
    )
    # The end is the start plus the duration, in the start's own form: an instant stays one
    # (written in UTC), a wall-clock time stays one (read in the case's zone by the casts).
    completed = (
        f"try(CASE WHEN regexp_matches({created}, {_ZONED}) THEN strftime(timezone('UTC', "
        f"TRY_CAST(regexp_replace({created}, '[Zz]$', '+00:00') AS TIMESTAMPTZ)) + {shift}, "
        f"'%Y-%m-%dT%H:%M:%S.%fZ') "
        f"ELSE strftime(TRY_CAST({created} AS TIMESTAMP) + {shift}, '%Y-%m-%dT%H:%M:%S.%f') END)"
    )
    columns = {
        "request_id": col("id"),
        "tenant_id": col(tenant_name) if where == "field" else m(tenant_name),
        "received_at": col("created_at"),
        "prompt_tokens": col("tokens_in"),
        "http_status": col("status_code"),
        "completion_tokens": col("tokens_out"),
        "completed_at": completed,
        "e2e_ms": col("duration"),
        "model": col("model"),
    }
    for name in _BY_NAME:
        columns[name] = m(name)
    unreadable = (
        f"WHEN __meta IS NOT NULL AND NOT __meta_ok THEN 'metadata is not a JSON object: its "
        f"{tenant_name} (the tenant) cannot be read' "
        if where == "metadata"
        else ""
    )
    why = (
        f"coalesce(__why, CASE WHEN lower({col('cached')}) = 'true' THEN {sql_str(CACHED)} "
        f"{unreadable}END)"
    )
    # What is left of the metadata once its mapped keys are taken out (kept as it is when it
    # is no object).
    rest_meta = (
        "CASE WHEN __meta_ok THEN nullif(CAST("
        f"{without('__meta::JSON', [*keys])} AS VARCHAR), '{{}}')::JSON "
        "WHEN __meta IS NOT NULL THEN to_json(__meta) END"
    )
    mapped = [*_MAPPED, "metadata", *([tenant_name] if where == "field" else [])]
    extra = (
        f"CAST(json_merge_patch({without('__rec', mapped)}, "
        f"json_object('metadata', {rest_meta})) AS JSON)"
    )
    return adapted(base, table, columns, pre_error=why, extra=extra)
