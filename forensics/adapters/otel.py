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

from forensics.adapters.records import adapted, nothing, open_records
from forensics.readers import sql_str

if TYPE_CHECKING:
    import duckdb

    from forensics.adapters import Options
    from forensics.readers import ByteProgress, Source

KINDS = ("requests",)
TENANT_KINDS = ("requests",)
DEFAULT_TENANT_FIELD = "tenant.id"

# One typed parse per export: every value as text (OTLP writes 64-bit integers as strings and
# some exporters as numbers; both read the same).
_VALUE = (
    '{"stringValue": "VARCHAR", "intValue": "VARCHAR", "doubleValue": "VARCHAR", '
    '"boolValue": "VARCHAR", "arrayValue": {"values": [{"stringValue": "VARCHAR"}]}}'
)
_ATTRS = f'[{{"key": "VARCHAR", "value": {_VALUE}}}]'
_SPAN = (
    '{"traceId": "VARCHAR", "spanId": "VARCHAR", "name": "VARCHAR", '
    '"startTimeUnixNano": "VARCHAR", "endTimeUnixNano": "VARCHAR", '
    f'"attributes": {_ATTRS}, "status": {{"code": "VARCHAR"}}}}'
)
_EXPORT = (
    '{"resourceSpans": [{"resource": {"attributes": ' + _ATTRS + "}, "
    '"scopeSpans": [{"spans": [' + _SPAN + "]}], "
    '"instrumentationLibrarySpans": [{"spans": [' + _SPAN + "]}]}]}"
)
# Canonical columns an attribute of the same name fills.
_BY_NAME = ("request_id", "prefill_node", "decode_node", "dp_rank", "bootstrap_room", "api_key_id")


def sniff(text: str) -> str | None:
    """Why ``text`` (a file's first bytes) is an OTLP/JSON trace export, or None."""
    return "an OTLP/JSON trace export (resourceSpans)" if '"resourceSpans"' in text else None


def _keys(attrs: str) -> str:
    """SQL of an attribute list's names, in order."""
    return f"list_transform(coalesce({attrs}, []), lambda x: x.key)"


def _values(attrs: str) -> str:
    """SQL of an attribute list's values as text, in order (an array by its first value)."""
    value = (
        "coalesce(x.value.stringValue, x.value.intValue, x.value.doubleValue, "
        'x.value.boolValue, x.value.arrayValue."values"[1].stringValue)'
    )
    return f"list_transform(coalesce({attrs}, []), lambda x: {value})"


def _lookup(keys: str, values: str, name: str) -> str:
    """SQL of the value of attribute ``name`` (its first, if given twice), NULL without one."""
    return f"{values}[list_position({keys}, {sql_str(name)})]"


def _as_map(keys: str, values: str, drop: list[str] | None = None) -> str:
    """SQL of the attributes as a map, less the names in ``drop``. An attribute without a name
    is left out and a name given twice keeps its first value (a map takes each name once)."""
    unwanted = ""
    if drop:
        unwanted = " AND NOT list_contains([" + ", ".join(sql_str(d) for d in drop) + "], e.key)"
    return (
        f"map_from_entries(list_filter(list_transform({keys}, "
        f"lambda key, i: {{'key': key, 'value': {values}[i]}}), "
        f"lambda e, i: e.key IS NOT NULL AND list_position({keys}, e.key) = i{unwanted}))"
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
        return nothing(base)
    table = f"__kv_otel_{tag}"
    tenant = options.tenant_field or DEFAULT_TENANT_FIELD
    # Exports -> resources -> spans, each level unnested with its position, so the spans keep
    # file order; a line that holds no span stays as one row (to be rejected). Each export is
    # parsed once, into the typed shape of an export: a field of another type reads as NULL
    # (the span is then rejected for what it lacks), and no span is printed and parsed again.
    con.execute(
        f"""CREATE TEMP TABLE {table} AS
    WITH l AS (
      SELECT __kv_row, __kv_line, json_valid(__kv_line) AS ok FROM {base.relation}
    ),
    d AS (
      SELECT __kv_row, json_transform(__kv_line, {sql_str(_EXPORT)}).resourceSpans AS rs
      FROM l WHERE ok
    ),
    r AS (
      SELECT __kv_row, unnest(rs) AS res, generate_subscripts(rs, 1) AS ri FROM d
    ),
    s AS (
      SELECT __kv_row, ri, {_keys("res.resource.attributes")} AS rk,
        {_values("res.resource.attributes")} AS rv,
        list_concat(flatten(list_transform(res.scopeSpans, lambda x: x.spans)),
                    flatten(list_transform(res.instrumentationLibrarySpans, lambda x: x.spans)))
          AS spans
      FROM r
    ),
    t AS (
      SELECT __kv_row, ri, rk, rv, unnest(spans) AS span, generate_subscripts(spans, 1) AS pi
      FROM s
    ),
    spans AS MATERIALIZED (
      SELECT __kv_row AS line, ri, 0 AS si, pi,
        {_keys("span.attributes")} AS ak, {_values("span.attributes")} AS av, rk, rv,
        span.traceId AS trace_id, span.spanId AS span_id, span.name AS name,
        span.startTimeUnixNano AS start_ns, span.endTimeUnixNano AS end_ns,
        span.status.code AS status
      FROM t
    ),
    rows AS (
      SELECT *, NULL AS why FROM spans
      UNION ALL BY NAME
      SELECT __kv_row AS line, 0 AS ri, 0 AS si, 0 AS pi, __kv_line,
        CASE WHEN NOT ok THEN 'not valid JSON'
             WHEN json_extract(__kv_line, '$.resourceSpans') IS NULL
             THEN 'no resourceSpans: not an OTLP/JSON trace export'
             ELSE 'an export with no spans' END AS why
      FROM l WHERE __kv_row NOT IN (SELECT line FROM spans)
    )
    SELECT row_number() OVER (ORDER BY line, ri, si, pi) AS __kv_row, rows.*,
      coalesce(why, CASE WHEN len(list_filter(ak, lambda k: starts_with(k, 'gen_ai.')))
        = 0 THEN 'a span with no gen_ai.* attribute: not an inference call' END) AS __why
    FROM rows"""
    )
    base.cleanup.append(table)

    def attr(*names: str) -> str:
        return "coalesce(" + ", ".join(_lookup("ak", "av", n) for n in names) + ")"

    error_type = attr("error.type")
    status = "coalesce(status, '')"
    failed = f"({error_type} IS NOT NULL OR {status} IN ('2', 'STATUS_CODE_ERROR'))"
    ttft = attr("gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token")
    start = "start_ns"
    columns = {
        "request_id": f"coalesce({attr('request_id', 'gen_ai.response.id')}, span_id)",
        "tenant_id": f"coalesce({_lookup('ak', 'av', tenant)}, {_lookup('rk', 'rv', tenant)})",
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
        "completed_at": "end_ns",
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
        tenant,
    ]

    extra = (
        "json_object('trace_id', trace_id, 'span_id', span_id, 'name', name, "
        f"'attributes', to_json({_as_map('ak', 'av', mapped)}), "
        f"'resource', to_json({_as_map('rk', 'rv', [tenant])}))"
    )
    why = (
        f"coalesce(__why, CASE WHEN {failed} AND ({columns['http_status']}) IS NULL THEN "
        f"'a failed call (error.type ' || coalesce({error_type}, 'not set') || ') without an "
        "HTTP status: what the client got is not in the span' END)"
    )
    # A rejected span is shown as the attributes it has; a rejected line as it is.
    raw = (
        "coalesce(__kv_line, to_json({'trace_id': trace_id, 'span_id': span_id, 'name': name, "
        f"'attributes': {_as_map('ak', 'av')}}})::VARCHAR)"
    )
    return adapted(base, table, columns, pre_error=why, extra=extra, raw_expr=raw)
