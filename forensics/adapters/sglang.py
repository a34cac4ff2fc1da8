"""SGLang engine logs: request logs, metrics exporter files, scheduler lines, server info.

``engine_legs`` come from any mix of these lines in one file (an engine's stdout holds them
all):

- ``--log-requests`` JSON events (``request.received``, ``request.received.openai``,
  ``request.finished``: ``timestamp``, ``rid``, ``obj``, ``out.meta_info``), and its text form
  (``Receive: obj=GenerateReqInput(...)``, ``Finish: obj=..., out={...}``);
- the request-metrics exporter's records (``sglang-request-metrics-*.log``: the meta_info
  fields, with the request's own fields as a JSON string in ``request_parameters``);
- scheduler lines: an abort with its reason (``<message>, self.rid='...'``, e.g. the input-length
  rejection), the KV-capacity rejection (``Request <rid> exceeds the maximum number of tokens:
  N > M``) and the stage-timing line (``ReqTimeStats(...)`` or the older ``Req Time Stats(...)``).

All lines of one file about one rid make one leg (one record: its ``source_row`` is its first
line). Text lines carry the logging prefix ``[YYYY-mm-dd HH:MM:SS ...]`` (no zone: the case's);
the request's own ``received_time`` (epoch seconds) is preferred where it is logged, and the
finish is ``received_time + e2e_latency``. ``pool_snapshots`` come from ``/get_server_info``
documents (one per file, pretty-printed or not, or one per line) and from the startup line
``max_total_num_tokens=..., context_len=...``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.adapters.records import (
    adapted,
    json_object,
    node_from_name,
    nothing,
    open_records,
    without,
)
from forensics.errors import EvidenceError
from forensics.readers import sql_str

if TYPE_CHECKING:
    import duckdb

    from forensics.adapters import Options
    from forensics.readers import ByteProgress, Source

KINDS = ("engine_legs", "pool_snapshots")
TENANT_KINDS = ("engine_legs",)
DEFAULT_TENANT_FIELD = "tenant_id"
EXPORTER_PREFIX = "sglang-request-metrics-"

# The logging prefix of every engine line: ``[2026-09-08 14:02:00 TP0] message``.
_PREFIX = r"^\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)(?: [^\]]*)?\]"
# The data-parallel rank in a scheduler line's logging prefix (``[2026-09-08 14:02:00 DP1
# TP0]``): SGLang adds `` DP<rank>`` to it when data parallelism is on.
_DP_IN_PREFIX = r"^\[[^\]]* DP(\d+)[ \]]"
_PREFIX_DP = (
    "CASE WHEN __at IS NOT NULL AND contains(left(__kv_line, 64), ' DP') THEN"
    f" nullif(regexp_extract(left(__kv_line, 64), {sql_str(_DP_IN_PREFIX)}, 1), '') END"
)
# A server-info document by keys only SGLang's server arguments have (a canonical snapshot
# also holds "max_total_num_tokens").
_SNIFF = re.compile(
    r'"event": ?"request\.(received|finished)|"request_parameters"'
    r'|"(model_path|disaggregation_mode|internal_states)"'
    r"|\] (Receive|Finish): obj=|\] (ReqTimeStats|Req Time Stats)\(|self\.rid='"
    r"|max_total_num_tokens=\d+"
)

# Why a line is no record of a request (engine_legs) or of a pool (pool_snapshots).
_OTHER = {
    "bad_json": "not valid JSON",
    "json_other": "a JSON line that is no request event (no request.received or "
    "request.finished event, no request_parameters)",
    "continuation": "no [timestamp] prefix: a continuation of the record above "
    "(e.g. a traceback) or other output",
    "startup": "the startup line (KV pool size): load this file as pool_snapshots to read it",
    "other": "a log line about no single request (batch statistics and the like)",
    "no_rid": "a request line without a rid",
}
_REQUEST_EVENTS = ("received", "finished", "exported", "timestats", "aborted", "capacity")


def sniff(text: str) -> str | None:
    """Why ``text`` (a file's first bytes) is SGLang output, or None."""
    m = _SNIFF.search(text)
    return f"SGLang output ({m.group(0).strip('] ')!r})" if m else None


def open_source(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    kind: str,
    tag: str,
    progress: ByteProgress | None,
    options: Options,
) -> Source:
    """One SGLang file as engine legs or pool snapshots (see the module docstring)."""
    node = options.node
    if node is None:
        if path.name.startswith(EXPORTER_PREFIX):
            raise EvidenceError(
                "a request-metrics exporter file does not name its engine: give node in its "
                "[[evidence]] entry (or --node)"
            )
        node = node_from_name(path)
    base = open_records(con, path, tag, progress)
    if kind == "pool_snapshots":
        return _snapshots(con, base, tag, node, options)
    return _legs(con, base, tag, node, options)


def _lines(table: str, validate: bool = True) -> str:
    """Each line's logging-prefix time and message, JSON lines flagged (and, with
    ``validate``, checked). String functions, not one regular expression over the whole line:
    a request line is long."""
    valid = "starts_with(__kv_line, '{') AND json_valid(__kv_line) AS __valid," if validate else ""
    return f"""SELECT __kv_row, __kv_line,
      starts_with(__kv_line, '{{') AS __json, {valid}
      CASE WHEN starts_with(__kv_line, '[')
        THEN nullif(regexp_extract(left(__kv_line, 64), {sql_str(_PREFIX)}, 1), '') END AS __at,
      CASE WHEN __at IS NOT NULL THEN ltrim(substr(__kv_line, strpos(__kv_line, ']') + 1), ' ')
        END AS __msg
    FROM {table}"""


def _after_last(text: str, rev: str, sep: str) -> str:
    """SQL of what follows the last ``sep`` in ``text`` (NULL without one), ``rev`` being
    ``text`` reversed (made once per line). A repr logs the request's text before its own
    fields and the generated text before ``meta_info``, so the last occurrence is the
    engine's, whatever the texts hold."""
    at = f"strpos({rev}, {sql_str(sep[::-1])})"
    return f"CASE WHEN {at} > 0 THEN right({text}, {at} - 1) END"


def _before_last(text: str, rev: str, sep: str) -> str:
    """SQL of what precedes the last ``sep`` in ``text`` (all of it without one)."""
    at = f"strpos({rev}, {sql_str(sep[::-1])})"
    end = f"length({text}) - {at} + 1 - {len(sep)}"
    return f"CASE WHEN {at} > 0 THEN left({text}, {end}) ELSE {text} END"


def _re(text: str, pattern: str) -> str:
    """SQL of the first group of ``pattern`` in ``text``, NULL when it does not match."""
    return f"nullif(regexp_extract({text}, {sql_str(pattern)}, 1), '')"


def _last_of(fields: str, field: str) -> str:
    """SQL of the value of the last ``field=value`` in ``fields``, a list of such texts: the
    request's own fields of a repr, read in one pass (see _after_last)."""
    prefix = sql_str(field + "=")
    return (
        f"substr(list_filter({fields}, lambda x: starts_with(x, {prefix}))[-1], {len(field) + 2})"
    )


def _last(text: str, field: str, value: str) -> str:
    """SQL of the value of the last ``field=`` of a repr (the request's own, see _after_last)."""
    pattern = rf"[(, ]{field}={value}"
    return f"regexp_extract_all({text}, {sql_str(pattern)}, 1)[-1]"


def _legs(con, base: Source, tag: str, node: str, options: Options) -> Source:
    tf = options.tenant_field or DEFAULT_TENANT_FIELD
    if base.empty:
        return nothing(base)
    legs = f"__kv_sg_legs_{tag}"
    label = re.escape(tf)
    # JSON request-log events and exporter records, in one parse per line.
    paths = {
        "event": "$.event",
        "timestamp": "$.timestamp",
        "rid": "$.rid",
        "room": "$.obj.bootstrap_room",
        "recv": "$.obj.received_time",
        "dp_obj": "$.obj.data_parallel_rank",
        "label": f"$.obj.custom_labels.{_json_key(tf)}",
        "header": f"$.headers.{_json_key(tf)}",
        "params": "$.request_parameters",
    }
    meta = {
        "id": "id",
        "prompt": "prompt_tokens",
        "output": "completion_tokens",
        "cached": "cached_tokens",
        "ftype": "finish_reason.type",
        "fstatus": "finish_reason.status_code",
        "fmsg": "finish_reason.message",
        "e2e": "e2e_latency",
        "dp": "dp_rank",
        "recv_ts": "request_received_ts",
        "done_ts": "request_finished_ts",
    }
    # Request events hold meta_info under out; exporter records at the top, beside their
    # request_parameters. Each line is parsed once, for the paths of its own kind.
    exported = dict(paths)
    for name, key in meta.items():
        paths[f"m_{name}"] = f"$.out.meta_info.{key}"
        exported[f"m_{name}"] = f"$.{key}"
    pick = "[" + ", ".join(sql_str(p) for p in paths.values()) + "]"
    pick_exported = "[" + ", ".join(sql_str(p) for p in exported.values()) + "]"
    j = {k: f"__j[{i + 1}]" for i, k in enumerate(paths)}
    params = ["rid", "bootstrap_room", "received_time", "data_parallel_rank"]
    ppick = "[" + ", ".join(sql_str(f"$.{p}") for p in params) + "]"
    ppick_label = sql_str(f"$.custom_labels.{_json_key(tf)}")

    def js(name: str) -> str:
        return j["m_" + name]

    msg = "__msg"
    # A Python repr quotes with ' unless the text holds a ' and no ".
    message = r"'finish_reason': \{[^}]*'message': "
    single, double = r"'((?:[^'\\]|\\.)*)'", r'"((?:[^"\\]|\\.)*)"'
    stats = r"^(?:ReqTimeStats|Req Time Stats)\((.*?)\): ?(.*)$"
    meta_re = {
        "prompt": r"'prompt_tokens': (\d+)",
        "output": r"'completion_tokens': (\d+)",
        "cached": r"'cached_tokens': (\d+)",
        "e2e": r"'e2e_latency': ([0-9.eE+-]+)",
        "dp": r"'dp_rank': (\d+)",
        "id": r"'id': '([^']*)'",
        "ftype": r"'finish_reason': \{'type': '([^']*)'",
        "fstatus": r"'finish_reason': \{[^}]*'status_code': (\d+)",
    }
    m = {k: _re("__meta", v) for k, v in meta_re.items()}
    head = {
        "rid": _re("__st_head", r"(?:^|, )rid=([^,]+)"),
        "room": _re("__st_head", r"bootstrap_room=(\d+)"),
        "prompt": _re("__st_head", r"input[_ ]len=(\d+)"),
        "output": _re("__st_head", r"output[_ ]len=(\d+)"),
        "cached": _re("__st_head", r"cached_input_len=(\d+)"),
        "role": _re("__st_head", r"type=(\w+)"),
    }
    # A text-form request's own fields are read once per request, from its last repr, after
    # grouping (its Receive and Finish lines log the same ones), all in one pass of one
    # pattern over the repr; only the rid is needed first.
    own = {
        "room": ("bootstrap_room", r"\d+"),
        "recv": ("received_time", r"[0-9.eE+-]+"),
        "dp": ("data_parallel_rank", r"\d+"),
        "tenant": ("custom_labels", r"\{[^}]*\}"),
    }
    own_pattern = "[(, ](" + "|".join(f"{f}={v}" for f, v in own.values()) + ")"
    o = {k: _last_of("__own", f) for k, (f, _) in own.items()}
    o["tenant"] = _re(o["tenant"], r"'" + label + r"': '([^']*)'")
    own_values = ", ".join(f"coalesce({k}, {v}) AS {k}" for k, v in o.items())
    obj_rid = _last("__obj", "rid", "'([^']*)'")
    fields = {
        "line_at": f"CASE WHEN __valid THEN {j['timestamp']} ELSE __at END",
        "rid": f"coalesce({j['rid']}, __rp[1], {j['m_id']}, {m['id']}, "
        f"{obj_rid}, {head['rid']}, nullif(__abort.rid, ''), "
        "nullif(__cap.rid, ''))",
        "room": f"coalesce({j['room']}, __rp[2], {head['room']})",
        "recv": f"coalesce({j['recv']}, __rp[3], {js('recv_ts')})",
        "e2e": f"coalesce({js('e2e')}, {m['e2e']})",
        "done": js("done_ts"),
        "dp": f"coalesce({js('dp')}, {j['dp_obj']}, __rp[4], {m['dp']})",
        # A scheduler's lines carry its data-parallel rank in their logging prefix ("[time DP1
        # TP0]"), in builds that log it nowhere else: taken where the request has none.
        "prefix_dp": _PREFIX_DP,
        "prompt": f"coalesce({js('prompt')}, {m['prompt']}, {head['prompt']}, nullif(__cap.n, ''))",
        "output": f"coalesce({js('output')}, {m['output']}, {head['output']})",
        "cached": f"coalesce({js('cached')}, {m['cached']}, {head['cached']})",
        "ftype": f"coalesce({js('ftype')}, {m['ftype']})",
        "fstatus": f"coalesce({js('fstatus')}, {m['fstatus']})",
        "fmsg": f"coalesce({js('fmsg')}, {_re('__meta', message + single)}, "
        f"{_re('__meta', message + double)})",
        "err": f"CASE WHEN ev = 'aborted' THEN __abort.err WHEN ev = 'capacity' THEN {msg} END",
        "capacity": "ev = 'capacity'",
        "role": head["role"],
        "stats": "nullif(__st_body, '')",
        "tenant": f"coalesce({j['label']}, {j['header']}, __rpl)",
        "obj_text": "__obj",
        # A request's last JSON record: what it holds beyond the mapped fields is kept.
        "last_json": "CASE WHEN __valid AND ev IN ('finished', 'exported') THEN __kv_line END",
    }
    node_sql, role_sql = sql_str(node), sql_str(options.role) if options.role else "NULL"
    reasons = "CASE ev " + " ".join(f"WHEN '{k}' THEN {sql_str(v)}" for k, v in _OTHER.items())
    events = ", ".join(f"'{e}'" for e in _REQUEST_EVENTS)
    con.execute(
        f"""CREATE TEMP TABLE {legs} AS
    WITH l AS ({_lines(base.relation, validate=False)}),
    j AS (
      -- One parse per JSON line: a line that does not parse has no values, and is bad JSON.
      SELECT *, CASE WHEN NOT __json THEN NULL
        WHEN contains(__kv_line, '"request_parameters"')
        THEN try(json_extract_string(__kv_line, {pick_exported}))
        ELSE try(json_extract_string(__kv_line, {pick})) END AS __j,
        __j IS NOT NULL AS __valid
      FROM l
    ),
    e AS (
      SELECT *, CASE
        WHEN __json AND NOT __valid THEN 'bad_json'
        WHEN __valid AND {j["event"]} LIKE 'request.received%' THEN 'received'
        WHEN __valid AND {j["event"]} = 'request.finished' THEN 'finished'
        WHEN __valid AND {j["params"]} IS NOT NULL THEN 'exported'
        WHEN __valid THEN 'json_other'
        WHEN __at IS NULL THEN 'continuation'
        WHEN starts_with({msg}, 'Receive: obj=') THEN 'received'
        WHEN starts_with({msg}, 'Finish: obj=') THEN 'finished'
        WHEN starts_with({msg}, 'ReqTimeStats(') OR starts_with({msg}, 'Req Time Stats(')
          THEN 'timestats'
        WHEN contains({msg}, ', self.rid=''') THEN 'aborted'
        WHEN starts_with({msg}, 'Request ')
          AND contains({msg}, ' exceeds the maximum number of tokens: ') THEN 'capacity'
        WHEN contains({msg}, 'max_total_num_tokens=') THEN 'startup'
        ELSE 'other' END AS ev
      FROM j
    ),
    r AS (SELECT *, CASE WHEN ev = 'finished' AND NOT __valid THEN reverse({msg}) END AS __rev
      FROM e),
    t AS (
      -- Each kind of line is taken apart only where it is that kind of line.
      SELECT *,
        CASE WHEN ev = 'exported' AND json_valid({j["params"]})
          THEN json_extract_string({j["params"]}, {ppick}) END AS __rp,
        CASE WHEN ev = 'exported' AND json_valid({j["params"]})
          THEN json_extract_string({j["params"]}, {ppick_label}) END AS __rpl,
        CASE WHEN __valid THEN NULL
          WHEN ev = 'received' THEN substr({msg}, 14)
          WHEN ev = 'finished' THEN substr({_before_last(msg, "__rev", ", out={")}, 13) END
          AS __obj,
        CASE WHEN ev = 'finished' AND NOT __valid
          THEN {_after_last(msg, "__rev", "'meta_info': {")} END AS __meta,
        CASE WHEN ev = 'timestats' THEN regexp_extract({msg}, {sql_str(stats)}, ['head', 'body'])
          END AS __st,
        CASE WHEN ev = 'aborted'
          THEN regexp_extract({msg}, '^(.*), self\\.rid=''([^'']*)''$', ['err', 'rid']) END
          AS __abort,
        CASE WHEN ev = 'capacity' THEN regexp_extract({msg},
          '^Request (\\S+) exceeds the maximum number of tokens: (\\d+) > (\\d+)',
          ['rid', 'n', 'max']) END AS __cap
      FROM r
    ),
    f AS (SELECT *, nullif(__st.head, '') AS __st_head, __st.body AS __st_body FROM t),
    facts AS (
      SELECT __kv_row, __kv_line, ev, {", ".join(f"{v} AS {k}" for k, v in fields.items())}
      FROM f
    ),
    keyed AS (
      SELECT *, CASE WHEN ev IN ({events}) AND rid IS NOT NULL THEN NULL
        WHEN ev IN ({events}) THEN {sql_str(_OTHER["no_rid"])} ELSE {reasons} END END
        AS __reason
      FROM facts
    )
    -- One pass groups the lines of each request; every other line is a group of its own.
    SELECT * EXCLUDE (__own) REPLACE ({own_values})
    FROM (SELECT *, CASE WHEN obj_text IS NOT NULL
        AND (room IS NULL OR recv IS NULL OR dp IS NULL OR tenant IS NULL)
      THEN regexp_extract_all(obj_text, {sql_str(own_pattern)}, 1) END AS __own
    FROM (SELECT min(__kv_row) AS __kv_row, arg_min(__kv_line, __kv_row) AS __kv_line,
      any_value(__reason) AS __why,
      CASE WHEN any_value(__reason) IS NULL THEN any_value(rid) END AS rid,
      coalesce(max(role), {role_sql}) AS role,
      arg_min(recv, __kv_row) FILTER (WHERE recv IS NOT NULL) AS recv,
      arg_min(line_at, __kv_row) FILTER (WHERE line_at IS NOT NULL) AS first_at,
      arg_max(line_at, __kv_row) FILTER (WHERE ev IN ('finished', 'exported', 'timestats')
        AND line_at IS NOT NULL) AS end_at,
      arg_max(e2e, __kv_row) FILTER (WHERE e2e IS NOT NULL) AS e2e,
      arg_max(done, __kv_row) FILTER (WHERE done IS NOT NULL) AS done,
      arg_max(prompt, __kv_row) FILTER (WHERE prompt IS NOT NULL AND NOT capacity) AS prompt,
      arg_max(prompt, __kv_row) FILTER (WHERE capacity) AS cap_prompt,
      arg_max(output, __kv_row) FILTER (WHERE output IS NOT NULL) AS output,
      arg_max(cached, __kv_row) FILTER (WHERE cached IS NOT NULL) AS cached,
      arg_max(room, __kv_row) FILTER (WHERE room IS NOT NULL) AS room,
      arg_max(dp, __kv_row) FILTER (WHERE dp IS NOT NULL) AS dp,
      arg_max(prefix_dp, __kv_row) FILTER (WHERE prefix_dp IS NOT NULL) AS prefix_dp,
      arg_max(ftype, __kv_row) FILTER (WHERE ftype IS NOT NULL) AS ftype,
      arg_max(fstatus, __kv_row) FILTER (WHERE fstatus IS NOT NULL) AS fstatus,
      arg_min(err, __kv_row) FILTER (WHERE err IS NOT NULL) AS err,
      arg_max(fmsg, __kv_row) FILTER (WHERE fmsg IS NOT NULL) AS fmsg,
      bool_or(capacity) AS capacity,
      arg_max(stats, __kv_row) FILTER (WHERE stats IS NOT NULL) AS stats,
      arg_max(tenant, __kv_row) FILTER (WHERE tenant IS NOT NULL) AS tenant,
      arg_max(obj_text, __kv_row) FILTER (WHERE obj_text IS NOT NULL) AS obj_text,
      arg_max(last_json, __kv_row) FILTER (WHERE last_json IS NOT NULL) AS last_json,
      arg_max(ev = 'exported', __kv_row) FILTER (WHERE last_json IS NOT NULL) AS last_exported,
      count(*) AS lines
    FROM keyed GROUP BY CASE WHEN __reason IS NULL THEN rid ELSE '#' || __kv_row END))"""
    )
    base.cleanup.append(legs)
    finished = (
        "coalesce(done, CAST(TRY_CAST(recv AS DECIMAL(20, 6)) + TRY_CAST(e2e AS DECIMAL(20, 6))"
        " AS VARCHAR), end_at)"
    )
    decode = "role = 'decode'"
    columns = {
        "request_id": "rid",
        "role": "role",
        "node": node_sql,
        "started_at": f"coalesce({_kv_allocated()}, recv, first_at)",
        "finished_at": finished,
        "input_tokens": "coalesce(prompt, cap_prompt)",
        # Decode preallocates KV for the whole prompt before the transfer; a capacity
        # rejection allocates nothing.
        "reserved_tokens": f"CASE WHEN {decode} AND capacity THEN '0' "
        f"WHEN {decode} THEN prompt END",
        "bootstrap_room": "room",
        "dp_rank": "coalesce(dp, prefix_dp)",
        "finish_type": "coalesce(ftype, CASE WHEN capacity THEN 'abort' END)",
        # An engine answers a request that finished normally with 200; an abort says its code.
        "status_code": "coalesce(fstatus, CASE WHEN ftype IS NOT NULL AND ftype <> 'abort' "
        "THEN '200' END)",
        "error": "coalesce(err, fmsg)",
    }
    # What the request's last JSON record holds beyond the mapped fields.
    logged = (
        "CASE WHEN last_json IS NULL THEN NULL WHEN last_exported "
        f"THEN {_exported_rest()} ELSE {_json_rest()} END"
    )
    extra = json_object(
        {
            "tenant_id": "tenant",
            "completion_tokens": "TRY_CAST(output AS BIGINT)",
            "cached_tokens": "TRY_CAST(cached AS BIGINT)",
            "e2e_latency": "TRY_CAST(e2e AS DOUBLE)",
            "time_stats": "stats",
            # Its allocation instant is rebuilt from durations to 10 microseconds; when
            # several are admitted at once, the queue's order (first in, first out) is known
            # from when each entered it: the timeline orders them so.
            "prealloc_wait_s": f"CASE WHEN role = 'decode' THEN {_prealloc_seconds()} END",
            "lines": "lines",
            "logged": logged,
        },
        documents=("logged",),
    )
    return adapted(
        base, legs, columns, pre_error="__why", extra=f"CASE WHEN rid IS NOT NULL THEN {extra} END"
    )


# A decode time-stats line, across releases: ``prealloc_queue_duration(X) = bootstrap(Y) +
# alloc_wait(Z); transfer_duration=...; queue_duration=..., forward_duration=..., start=T``
# (``start`` on the scheduler's monotonic clock), or ``bootstrap_duration=Y, alloc_wait_duration=
# Z, transfer_duration=..., ..., entry_time=E`` (``E`` a wall clock), or
# ``prealloc_queue_duration=X, ...``. A unified one: ``queue_duration=..., forward_duration=...,
# entry_time=E`` (older: ``start_time=T``, monotonic).
_STATS_MS = {
    "prealloc": r"prealloc_queue_duration[(=]([0-9.]+)ms",
    "bootstrap": r"(?:^|[ ;,])bootstrap_duration=([0-9.]+)ms",
    "alloc_wait": r"(?:^|[ ;,])alloc_wait_duration=([0-9.]+)ms",
    "transfer": r"(?:^|[ ;,])transfer_duration=([0-9.]+)ms",
    "queue": r"(?:^|[ ;,])queue_duration=([0-9.]+)ms",
    "forward": r"(?:^|[ ;,])forward_duration=([0-9.]+)ms",
}
_STATS_ENTRY = r"(?:^|[ ;,])entry_time=([0-9.]+)"


def _kv_allocated() -> str:
    """SQL of when a decode or unified leg's KV pages were allocated, in epoch seconds, from
    its time-stats line (NULL without one): the moment the replay needs, not when the request
    arrived.

    A decode request first waits in the preallocation queue (the bootstrap handshake, then for
    free pages: seconds when the pool is full); everything after the allocation, transfer,
    queue and forward, runs to the end. A unified request waits in the scheduler's queue and is
    given its pages when a batch takes it in; the forward runs from there to the end.

    In order of trust: the leg's end (its received time plus e2e latency, to the microsecond)
    less what followed the allocation, to 10 microseconds: the replay frees the leg's pages at
    that same end, so allocations and frees keep their order; the queue's wall-clock entry,
    logged to the millisecond, plus the queueing; its received time plus the queueing, which
    is early by the server's tokenizing and dispatch (a long prompt's can take a second). Kept
    within the leg's span.
    """

    sec = _stats_seconds
    decode = "role = 'decode'"
    queued = f"CASE WHEN {decode} THEN {_prealloc_seconds()} ELSE {sec('queue')} END"
    after = (
        f"CASE WHEN {decode} THEN {sec('transfer')} + {sec('queue')} + {sec('forward')} "
        f"ELSE {sec('forward')} END"
    )
    recv = "TRY_CAST(recv AS DECIMAL(20, 6))"
    end = f"coalesce(TRY_CAST(done AS DECIMAL(20, 6)), {recv} + TRY_CAST(e2e AS DECIMAL(20, 6)))"
    entry = f"TRY_CAST({_re('stats', _STATS_ENTRY)} AS DECIMAL(20, 6))"
    at = f"coalesce({end} - ({after}), {entry} + ({queued}), {recv} + ({queued}))"
    return (
        f"CASE WHEN role IN ('decode', 'unified') AND stats IS NOT NULL "
        f"THEN CAST(CAST(least(greatest({at}, {recv}), {end}) AS DECIMAL(20, 6)) AS VARCHAR) END"
    )


def _stats_seconds(name: str) -> str:
    """SQL of one duration of the time-stats line, in seconds (NULL when it has none)."""
    return f"(TRY_CAST({_re('stats', _STATS_MS[name])} AS DECIMAL(18, 6)) * 0.001)"


def _prealloc_seconds() -> str:
    """SQL of how long a decode leg waited in the preallocation queue (the handshake and the
    wait for pages), in seconds, from its time-stats line."""
    sec = _stats_seconds
    return f"coalesce({sec('prealloc')}, {sec('bootstrap')} + {sec('alloc_wait')})"


def _json_key(name: str) -> str:
    return '"' + name.replace('"', '\\"') + '"'


_MAPPED_OBJ = ["rid", "bootstrap_room", "received_time", "data_parallel_rank"]
_MAPPED_META = [
    "id",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
    "e2e_latency",
    "dp_rank",
]


def _json_rest() -> str:
    """What a request's last event holds beyond the mapped fields (``extra.logged``)."""
    # Both parts from one parse of the record (the lambda binds them once).
    obj = without("coalesce(p[1], '{}')", _MAPPED_OBJ)
    meta = without("coalesce(p[2], '{}')", _MAPPED_META)
    return (
        "list_transform([json_extract(last_json, ['$.obj', '$.out.meta_info'])], "
        f"lambda p: json_object('obj', {obj}, 'meta_info', {meta}))[1]"
    )


def _exported_rest() -> str:
    top = without("last_json", [*_MAPPED_META, "request_parameters"])
    params = without(
        "coalesce(TRY_CAST(json_extract_string(last_json, '$.request_parameters') AS JSON), '{}')",
        _MAPPED_OBJ,
    )
    return f"json_object('obj', {params}, 'meta_info', {top})"


# --- pool snapshots -----------------------------------------------------------------------

_STARTUP = r"max_total_num_tokens=(\d+)"
_SERVER_INFO = {
    "max_total_num_tokens": ["$.max_total_num_tokens", "$.internal_states[0].max_total_num_tokens"],
    "max_req_input_len": ["$.max_req_input_len", "$.internal_states[0].max_req_input_len"],
    "context_length": ["$.context_length", "$.internal_states[0].context_len"],
    "page_size": ["$.page_size"],
    "dp_size": ["$.dp_size"],
    "engine_version": ["$.version"],
    "disaggregation_mode": ["$.disaggregation_mode"],
}


def _snapshots(con, base: Source, tag: str, node: str, options: Options) -> Source:
    if base.empty:
        return nothing(base)
    table = f"__kv_sg_pool_{tag}"
    paths = [p for group in _SERVER_INFO.values() for p in group]
    pick = "[" + ", ".join(sql_str(p) for p in paths) + "]"
    at = {}
    i = 1
    for name, group in _SERVER_INFO.items():
        at[name] = "coalesce(" + ", ".join(f"__j[{i + k}]" for k in range(len(group))) + ")"
        i += len(group)
    observed = options.observed_at.isoformat() if options.observed_at else None
    con.execute(
        f"""CREATE TEMP TABLE {table} AS
    WITH l AS ({_lines(base.relation)})
    SELECT __kv_row, __kv_line, __valid, __json, __at, __msg,
      CASE WHEN __valid THEN json_extract_string(__kv_line, {pick}) END AS __j,
      regexp_extract(__msg, {sql_str(_STARTUP)}, 1) AS __pool
    FROM l"""
    )
    base.cleanup.append(table)
    documents = con.execute(f"SELECT count(*) FROM {table} WHERE __valid").fetchone()[0]
    if documents and observed is None:
        raise EvidenceError(
            "a /get_server_info document does not say when it was taken: give observed_at "
            "in its [[evidence]] entry"
        )
    mode = at["disaggregation_mode"]
    role = (
        f"coalesce({sql_str(options.role) if options.role else 'NULL'}, CASE WHEN __valid THEN "
        f"CASE WHEN {mode} IS NULL OR {mode} = 'null' THEN 'unified' ELSE {mode} END END)"
    )

    def field(name: str, pattern: str | None = None) -> str:
        text = f", {_re('__msg', pattern)}" if pattern else ""
        return f"CASE WHEN __valid THEN {at[name]} ELSE coalesce(NULL{text}) END"

    startup = "__pool <> ''"
    why = (
        f"CASE WHEN __valid OR ({startup}) THEN NULL "
        f"WHEN __json THEN 'not valid JSON' "
        f"WHEN __at IS NULL THEN {sql_str(_OTHER['continuation'])} "
        "ELSE 'a log line that is not the startup line (no max_total_num_tokens=)' END"
    )
    columns = {
        "node": sql_str(node),
        "observed_at": f"CASE WHEN __valid THEN {sql_str(observed or '')} ELSE __at END",
        "max_total_num_tokens": f"CASE WHEN __valid THEN {at['max_total_num_tokens']} "
        "ELSE nullif(__pool, '') END",
        "role": role,
        "max_req_input_len": field("max_req_input_len"),
        "context_length": field("context_length", r"context_len=(\d+)"),
        "page_size": field("page_size"),
        "dp_size": field("dp_size"),
        "engine_version": field("engine_version"),
    }
    mapped = [p.removeprefix("$.") for p in paths if p.count(".") == 1]
    numbers = {"available_gpu_mem": "DOUBLE"} | {
        k: "BIGINT" for k in ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests")
    }
    startup_rest = json_object(
        {k: f"TRY_CAST({_re('__msg', k + r'=([0-9.]+)')} AS {t})" for k, t in numbers.items()}
    )
    extra = f"CASE WHEN __valid THEN {without('__kv_line', mapped)} ELSE {startup_rest} END"
    return adapted(base, table, columns, pre_error=why, extra=extra)
