"""OpenTelemetry GenAI spans in OTLP/JSON -> ``requests``.

Reads what the collector's file exporter writes (one ``{"resourceSpans": [...]}`` export per
line) and a single export saved as one document, pretty-printed or not; the pre-1.0
``instrumentationLibrarySpans`` spelling is read too. Every span of an export is a record
(``source_row`` counts spans in file order); a span with no ``gen_ai.*`` attribute is no
inference call and is rejected as such.

Attributes: the current ``gen_ai.usage.input_tokens`` / ``output_tokens`` and the older
``gen_ai.usage.prompt_tokens`` / ``completion_tokens``; the tenant from ``tenant_field``
(default ``tenant.id``), a span attribute first, then a resource attribute. Attribute values
are OTLP ``AnyValue`` objects (64-bit integers arrive as strings). An attribute named like a
canonical column (``prefill_node``, ``decode_node``, ``dp_rank``, ``bootstrap_room``,
``api_key_id``, ``request_id``) maps onto that column; every other attribute, the trace and
span ids and the span name are kept in ``extra``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forensics.adapters.records import adapted, open_records
from forensics.readers import sql_str

if TYPE_CHECKING:
    import duckdb

    from forensics.adapters import Options
    from forensics.readers import ByteProgress, Source

KINDS = ("requests",)
TENANT_KINDS = ("requests",)
DEFAULT_TENANT_FIELD = "tenant.id"

_ATTRS = '\'[{"key": "VARCHAR", "value": "JSON"}]\''
_LIST = "'[\"JSON\"]'"
# Canonical columns an attribute of the same name fills.
_BY_NAME = ("request_id", "prefill_node", "decode_node", "dp_rank", "bootstrap_room", "api_key_id")


def sniff(text: str) -> str | None:
    """Why ``text`` (a file's first bytes) is an OTLP/JSON trace export, or None."""
    return "an OTLP/JSON trace export (resourceSpans)" if '"resourceSpans"' in text else None


def _value(v: str) -> str:
    """SQL of an OTLP AnyValue (JSON) as text: scalars as they are, arrays by first value."""
    return (
        f"coalesce(json_extract_string({v}, '$.stringValue'), "
        f"json_extract_string({v}, '$.intValue'), json_extract_string({v}, '$.doubleValue'), "
        f"json_extract_string({v}, '$.boolValue'), "
        f"json_extract_string({v}, '$.arrayValue.values[0].stringValue'))"
    )


def open_source(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    kind: str,
    tag: str,
    progress: ByteProgress | None,
    options: Options,
) -> Source:
    """The GenAI spans of an OTLP/JSON file as requests."""
    base = open_records(con, path, tag, progress)
    if base.empty:
        return adapted(base, "(SELECT 1 WHERE false)", {})
    table = f"__kv_otel_{tag}"
    tenant = sql_str(options.tenant_field or DEFAULT_TENANT_FIELD)
    # Exports -> resources -> scopes -> spans, each level unnested with its position, so the
    # spans keep file order; a line that holds no span stays as one row (to be rejected).
    con.execute(
        f"""CREATE TEMP TABLE {table} AS
    WITH l AS (
      SELECT __kv_row, __kv_line, json_valid(__kv_line) AS ok FROM {base.relation}
    ),
    r AS (
      SELECT __kv_row, unnest(from_json(json_extract(__kv_line, '$.resourceSpans'), {_LIST}))
               AS res,
             generate_subscripts(from_json(json_extract(__kv_line, '$.resourceSpans'), {_LIST}),
               1) AS ri
      FROM l WHERE ok
    ),
    s AS (
      SELECT __kv_row, ri, res,
        unnest(from_json(coalesce(json_extract(res, '$.scopeSpans'),
               json_extract(res, '$.instrumentationLibrarySpans')), {_LIST})) AS sc,
        generate_subscripts(from_json(coalesce(json_extract(res, '$.scopeSpans'),
               json_extract(res, '$.instrumentationLibrarySpans')), {_LIST}), 1) AS si
      FROM r
    ),
    p AS (
      SELECT __kv_row, ri, si, res,
        unnest(from_json(json_extract(sc, '$.spans'), {_LIST})) AS span,
        generate_subscripts(from_json(json_extract(sc, '$.spans'), {_LIST}), 1) AS pi
      FROM s
    ),
    spans AS (
      SELECT __kv_row AS line, ri, si, pi, span,
        map_from_entries(coalesce(from_json(json_extract(span, '$.attributes'), {_ATTRS}), []))
          AS a,
        map_from_entries(coalesce(from_json(json_extract(res, '$.resource.attributes'),
          {_ATTRS}), [])) AS ra
      FROM p
    ),
    rows AS (
      SELECT line, ri, si, pi, span, a, ra, NULL AS why FROM spans
      UNION ALL
      SELECT __kv_row, 0, 0, 0, NULL, NULL, NULL,
        CASE WHEN NOT ok THEN 'not valid JSON'
             WHEN json_extract(__kv_line, '$.resourceSpans') IS NULL
             THEN 'no resourceSpans: not an OTLP/JSON trace export'
             ELSE 'an export with no spans' END
      FROM l WHERE __kv_row NOT IN (SELECT line FROM spans)
    )
    SELECT row_number() OVER (ORDER BY line, ri, si, pi) AS __kv_row, line, span, a, ra,
      coalesce(why, CASE WHEN len(list_filter(map_keys(a), lambda k: starts_with(k, 'gen_ai.'))) = 0
        THEN 'a span with no gen_ai.* attribute: not an inference call' END) AS __why,
      CASE WHEN span IS NULL THEN (SELECT __kv_line FROM l WHERE l.__kv_row = line)
           ELSE span::VARCHAR END AS __kv_line
    FROM rows"""
    )
    base.cleanup.append(table)

    def attr(*names: str) -> str:
        return "coalesce(" + ", ".join(_value(f"a[{sql_str(n)}]") for n in names) + ")"

    error_type = attr("error.type")
    status = "coalesce(json_extract_string(span, '$.status.code'), '')"
    failed = f"({error_type} IS NOT NULL OR {status} IN ('2', 'STATUS_CODE_ERROR'))"
    ttft = attr("gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token")
    start = "json_extract_string(span, '$.startTimeUnixNano')"
    columns = {
        "request_id": f"coalesce({attr('request_id', 'gen_ai.response.id')}, "
        "json_extract_string(span, '$.spanId'))",
        "tenant_id": f"coalesce({_value(f'a[{tenant}]')}, {_value(f'ra[{tenant}]')})",
        "received_at": start,
        "prompt_tokens": attr("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        # An inference span without an HTTP status succeeded unless it says it failed;
        # a failed call's error.type is the status code when HTTP gave one.
        "http_status": f"coalesce({attr('http.response.status_code', 'http.status_code')}, "
        f"CASE WHEN regexp_full_match({error_type}, '[1-5][0-9][0-9]') THEN {error_type} END, "
        f"CASE WHEN NOT {failed} THEN '200' END)",
        "completion_tokens": attr("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        "cached_tokens": attr("gen_ai.usage.cache_read.input_tokens"),
        "first_token_at": f"CAST(TRY_CAST({start} AS HUGEINT) + "
        f"CAST(round(TRY_CAST({ttft} AS DOUBLE) * 1e6) AS HUGEINT) * 1000 AS VARCHAR)",
        "completed_at": "json_extract_string(span, '$.endTimeUnixNano')",
        "ttft_ms": f"TRY_CAST({ttft} AS DOUBLE) * 1000",
        "finish_reason": attr("gen_ai.response.finish_reasons"),
        "model": attr("gen_ai.request.model", "gen_ai.response.model"),
        "client_ip": attr("client.address"),
        "user_agent": attr("user_agent.original"),
    }
    for name in _BY_NAME:
        if name != "request_id":
            columns[name] = attr(name)
    mapped = [
        "request_id",
        *_BY_NAME,
        "gen_ai.response.id",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "http.response.status_code",
        "http.status_code",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.server.time_to_first_token",
        "gen_ai.response.finish_reasons",
        "gen_ai.request.model",
        "client.address",
        "user_agent.original",
        options.tenant_field or DEFAULT_TENANT_FIELD,
    ]
    entry = f"lambda e: {{'key': e.key, 'value': {_value('e.value')}}}"

    def rest(attrs: str, keep: str) -> str:
        # What is left of an attribute list once the mapped ones are taken out, as text.
        return (
            f"to_json(map_from_entries(list_transform(list_filter(map_entries({attrs}), "
            f"lambda e: NOT list_contains({keep}, e.key)), {entry})))"
        )

    keep = "[" + ", ".join(sql_str(m) for m in mapped) + "]"
    extra = (
        "json_object('trace_id', json_extract_string(span, '$.traceId'), "
        "'span_id', json_extract_string(span, '$.spanId'), "
        "'name', json_extract_string(span, '$.name'), "
        f"'attributes', {rest('a', keep)}, 'resource', {rest('ra', f'[{tenant}]')})"
    )
    why = (
        f"coalesce(__why, CASE WHEN {failed} AND ({columns['http_status']}) IS NULL THEN "
        f"'a failed call (error.type ' || coalesce({error_type}, 'not set') || ') without an "
        "HTTP status: what the client got is not in the span' END)"
    )
    return adapted(base, table, columns, pre_error=why, extra=extra)
