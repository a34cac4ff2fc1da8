"""Detection: run the SQL detectors of ``queries/`` over a case and write the findings tables.

Each detector is a ``.sql`` file with a ``.yml`` beside it (id, title, severity, description,
parameters with defaults, output columns, and its own true/false-positive cases). A detector
reads the working views of ``forensics/sql/prepare.sql`` and returns one row per flagged
request: ``request_id, value, threshold, detail, evidence``. Parameters are bound as DuckDB
named parameters; the description shown in reports is rendered from the same values.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

from forensics.detectors import VERDICT_RULES, Detector, load_detectors, query_set_hash
from forensics.progress import StepProgress
from forensics.sql import first_row, run_sql_file, scalar
from forensics.terminal import counted_parts, utc
from forensics.verdicts import NOTIFIED_VERDICTS, VERDICTS, sql_list

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case

# Warnings that may mean a customer goes untold (a false all-clear), by code: they come first
# wherever they were found, and head the report's summary under these titles as well as the
# methodology's list of warnings.
ALERTS = {
    "exclusion_beyond_named_tenants": "An exclusion may hide customers",
    "outside_window": "The analysis window may be too narrow",
    "logs_keyed_apart": "The client and engine logs may not name the same requests",
    "node_unlogged": "A node's engine log is missing",
}


@overload
def default_threshold(pool_tokens: int, context_length: int | None) -> int: ...
@overload
def default_threshold(pool_tokens: None, context_length: int | None) -> None: ...
def default_threshold(pool_tokens: int | None, context_length: int | None) -> int | None:
    """SGLang's max_req_input_len for a pool, by the one rule of ``sql/rules.sql``.

    >>> default_threshold(681280, 1048576)
    681274
    >>> default_threshold(None, 1048576) is None
    True
    """
    if pool_tokens is None:
        return None
    return scalar(
        _rules(),
        "SELECT sglang_input_limit($pool::BIGINT, $ctx::BIGINT)",
        {"pool": pool_tokens, "ctx": context_length},
    )


@functools.cache
def _rules() -> duckdb.DuckDBPyConnection:
    """An in-memory connection holding the shared rules, for Python callers (the gate checks a
    fleet node by node; one connection serves them all)."""
    from forensics.db import connect

    return connect(":memory:")


def case_parameters(case: Case) -> dict[str, Any]:
    """Every detection parameter for this case: each tunable's default (forensics.parameters)
    overridden by the manifest's ``[detection]``, and the values derived from the manifest."""
    from forensics.parameters import defaults

    det_cfg = case.detection
    params = defaults() | det_cfg.overrides
    params["context_length"] = case.context_length
    params["default_threshold_tokens"] = default_threshold(
        det_cfg.default_pool_tokens, case.context_length
    )
    params["default_pool_tokens"] = det_cfg.default_pool_tokens
    params["default_page_size"] = det_cfg.default_page_size
    params["overlap_window_s"] = det_cfg.overlap_window.total_seconds()
    return params


def prepare(
    con: duckdb.DuckDBPyConnection,
    params: dict[str, Any],
    *,
    model: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> None:
    """Create the working views every detector reads (see ``sql/prepare.sql``)."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE detect_params AS SELECT
             $model::VARCHAR AS model, $start::TIMESTAMPTZ AS start_at,
             $end::TIMESTAMPTZ AS end_at, $context_length::BIGINT AS context_length,
             $page::BIGINT AS default_page_size""",
        {
            "model": model,
            "start": start,
            "end": end,
            "context_length": params.get("context_length"),
            "page": params.get("default_page_size") or 1,
        },
    )
    run_sql_file(con, "prepare.sql")


def bind(det: Detector, params: dict[str, Any]) -> dict[str, Any]:
    """The named parameters one detector's SQL uses, from the run's parameter set."""
    return {name: params.get(name, spec.get("default")) for name, spec in det.parameters.items()}


def run_detector(con: duckdb.DuckDBPyConnection, det: Detector, params: dict[str, Any]):
    """Run one detector; returns its result as an Arrow table.

    On an engine that translates the SQL (Spark), a detector it cannot translate or run is
    named in the error."""
    from forensics.errors import ForensicsError

    try:
        return con.sql(det.sql.rstrip().rstrip(";"), params=bind(det, params)).to_arrow_table()
    except ForensicsError as exc:
        raise type(exc)(f"detector {det.id} ({det.path.name}): {exc}") from None


@dataclass
class DetectSummary:
    """What one detection run found."""

    hits: dict[str, int]
    verdicts: dict[str, int]
    affected: int  # confirmed + likely
    exposures: int
    warnings: list[str] = field(default_factory=list)
    warning_codes: list[str] = field(default_factory=list)  # each warning's code, in order
    excluded: int = 0  # of the affected: responses to excluded traffic
    # Evidence read in place by this detection (forensics.lake): what a local ingest of the
    # same files would report (an IngestResult), or None when detection read the case database.
    ingested: Any = None


def run_detectors(
    con: duckdb.DuckDBPyConnection,
    params: dict[str, Any],
    detectors: list[Detector] | None = None,
    progress: StepProgress | None = None,
) -> dict[str, int]:
    """Run every detector, filling findings_signals and findings_detectors; returns hits.

    ``progress`` is told of each detector before it runs.
    """
    from forensics.schema import FINDINGS_DDL

    detectors = detectors if detectors is not None else load_detectors()
    con.execute(FINDINGS_DDL["findings_signals"])
    con.execute(FINDINGS_DDL["findings_detectors"])
    hits: dict[str, int] = {}
    for ordinal, det in enumerate(detectors):
        if progress:
            progress(f"Detector {det.id}", ordinal, len(detectors))
        result = run_detector(con, det, params)
        con.register("detector_result", result)
        con.execute(
            """INSERT INTO findings_signals SELECT request_id, $signal, $id, value, threshold,
                 detail, evidence FROM detector_result""",
            {"signal": det.signal, "id": det.id},
        )
        # Later stages (the latency fit) must not learn from what earlier ones flagged.
        con.execute("INSERT INTO detect_flagged SELECT request_id FROM detector_result")
        con.unregister("detector_result")
        hits[det.id] = result.num_rows
        con.execute(
            "INSERT INTO findings_detectors VALUES ($id, $title, $sev, $desc, $params, $hits, $o)",
            {
                "id": det.id,
                "title": det.title,
                "sev": det.severity,
                "desc": det.describe(bind(det, params)),
                "params": json.dumps(bind(det, params), sort_keys=True),
                "hits": result.num_rows,
                "o": ordinal,
            },
        )
    return hits


def assign_verdicts(
    con: duckdb.DuckDBPyConnection,
    params: dict[str, Any],
    detectors: list[Detector] | None = None,
) -> dict[str, int]:
    """Turn signals into one verdict per request (findings_affected); returns counts.

    Each detector's declared verdict rules (its metadata's ``verdict``) go into a working table
    that ``sql/verdicts.sql`` applies: no signal is named in the SQL.
    """
    columns = ", ".join(f"{rule} VARCHAR" for rule in VERDICT_RULES)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE detector_effects "
        f"(signal VARCHAR, limit_rank INTEGER, {columns})"
    )
    con.executemany(
        f"INSERT INTO detector_effects VALUES (?, ?, {', '.join('?' for _ in VERDICT_RULES)})",
        [
            [det.signal, det.limit_from_threshold] + [det.verdict.get(r) for r in VERDICT_RULES]
            for det in (detectors if detectors is not None else load_detectors())
        ],
    )
    run_sql_file(con, "verdicts.sql", params)
    rows = con.execute(
        "SELECT verdict, count(*) FROM findings_affected GROUP BY verdict"
    ).fetchall()
    return dict.fromkeys(VERDICTS, 0) | dict(rows)


def detect_case(
    con: duckdb.DuckDBPyConnection, case: Case, progress: StepProgress | None = None
) -> DetectSummary:
    """Run detection end to end on a loaded case and (re)write every findings table.

    Signals and verdicts, exclusion marks, source attribution, the exploitation assessment and
    log coverage. Findings are replaced whole, so they always match the evidence loaded now.
    ``progress`` is told of each step (each detector, each decode rank attribution replays).
    """
    from forensics import attribution, basis, coverage, exclusions, exploitation, summary
    from forensics.schema import FINDINGS_DDL, SCOPE_DDL

    def step(what: str, done: int = 0, total: int = 0) -> None:
        if progress:
            progress(what, done, total)

    for ddl in FINDINGS_DDL.values():
        con.execute(ddl)
    # A scope computed from earlier findings no longer holds: scoping writes it anew.
    for table in SCOPE_DDL:
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")
    params = case_parameters(case)
    step("Preparing the working views")
    prepare(con, params, model=case.model, start=case.start, end=case.end)
    warnings = evidence_warnings(con, params)
    detectors = load_detectors()
    hits = run_detectors(con, params, detectors, progress=progress)
    step("Verdicts and exclusions")
    verdicts = assign_verdicts(con, params, detectors)
    exclusions.mark_exclusions(con, case.exclusions)
    attributed = attribution.attribute(con, params, progress=progress)
    warnings += attributed.warnings
    warnings += exclusions.overreach_warnings(con, case.exclusions)
    step("Evidence basis", 0, 4)
    evidence = basis.evidence_basis(con)
    basis.record_basis(con, evidence)
    step("Exploitation assessment", 1, 4)
    exploitation.assess(con, params, evidence)
    step("Log coverage", 2, 4)
    coverage.assess(con, params)
    warnings += coverage.keying_warnings(con)
    warnings += coverage.unlogged_node_warnings(con)
    step("Summarising the traffic for the report", 3, 4)
    summary.summarise(con, params)
    # A warning that may mean a customer goes untold comes first, wherever it was found.
    warnings.sort(key=lambda w: w[0] not in ALERTS)
    for code, message in warnings:
        con.execute("INSERT INTO findings_warnings VALUES ($c, $m)", {"c": code, "m": message})
    case_values = {
        "query_set_hash": query_set_hash(),
        "attribution_methods": attributed.methods,
        "window": {
            "start": case.start.isoformat().replace("+00:00", "Z") if case.start else None,
            "end": case.end.isoformat().replace("+00:00", "Z") if case.end else None,
        },
        "parameters": {k: params[k] for k in sorted(params)},
    }
    for key, value in case_values.items():
        con.execute(
            "INSERT INTO findings_case VALUES ($k, $v)",
            {"k": key, "v": json.dumps(value, sort_keys=True)},
        )
    return DetectSummary(
        hits=hits,
        verdicts=verdicts,
        affected=sum(verdicts[v] for v in NOTIFIED_VERDICTS),
        exposures=scalar(con, "SELECT count(*) FROM findings_exposures"),
        warnings=[m for _, m in warnings],
        warning_codes=[c for c, _ in warnings],
        excluded=scalar(
            con,
            "SELECT count(*) FROM findings_affected WHERE excluded_by IS NOT NULL"
            f" AND verdict IN {sql_list(NOTIFIED_VERDICTS)}",
        ),
    )


def evidence_warnings(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> list[tuple]:
    """Say which evidence is missing and what detection falls back to without it."""
    count = {
        t: scalar(con, f"SELECT count(*) FROM {t}")  # noqa: S608 - fixed names
        for t in ("requests", "engine_legs", "pool_snapshots", "kv_allocations")
    }
    out = []
    if count["requests"] == 0:
        if count["engine_legs"] == 0:
            out.append(
                (
                    "no_requests",
                    "Neither client requests nor engine legs are loaded: nothing can be judged.",
                )
            )
        else:
            out.append(
                (
                    "no_requests",
                    "No client requests are loaded: affected responses come from engine"
                    " records alone, their tenants are unknown unless the legs carry a tenant"
                    " label, over_pool judges the prompt each decode leg reserved, and latency"
                    " and exploitation cannot be judged.",
                )
            )
    if count["pool_snapshots"] == 0:
        if params.get("default_threshold_tokens") is None:
            out.append(
                (
                    "no_pool_limit",
                    "No pool snapshots and no [detection].default_pool_tokens:"
                    " over_pool only sees limits logged in prefill rejection messages.",
                )
            )
        else:
            out.append(
                (
                    "no_pool_snapshots",
                    "No pool snapshots: over_pool uses the limit implied"
                    f" by default_pool_tokens ({params['default_threshold_tokens']:,} tokens)"
                    " for every prefill node.",
                )
            )
    if count["engine_legs"] == 0:
        out.append(
            (
                "no_engine_legs",
                "No engine legs: prefill_rejected and token_mismatch cannot"
                " fire, verdicts rest on over_pool and latency alone.",
            )
        )
    if count["requests"]:
        missing = first_row(
            con,
            """SELECT count(*) FILTER (WHERE prefill_node IS NULL),
                      count(*) FILTER (WHERE decode_node IS NULL), count(*)
               FROM scoped_requests""",
        )
        if missing[0]:
            out.append(
                (
                    "no_prefill_node",
                    f"{missing[0]:,} of {missing[2]:,} requests have no"
                    " prefill_node: over the largest prefill limit in force they are over_pool,"
                    " over only the smallest over_pool_unplaced (for review).",
                )
            )
        if missing[1]:
            out.append(
                (
                    "no_decode_node",
                    f"{missing[1]:,} of {missing[2]:,} requests have no"
                    " decode_node: their decode pool is assumed to fit and their sources"
                    " cannot be attributed to a node.",
                )
            )
    return out + _outside_window(con, params)


def _outside_window(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> list[tuple]:
    """A warning when requests loaded outside the manifest's window show the defect's
    signature: detection judges only the window, so a window set too narrow would leave their
    responses unjudged and their tenants untold."""
    found = first_row(
        con,
        # Joins, not membership tests or scalar subqueries, which Spark plans as nested loops.
        """WITH outside AS (
             SELECT r.request_id, r.prompt_tokens, r.answered, r.received_at,
                    r.received_at < p.start_at AS before
             FROM all_requests r, detect_params p
             WHERE r.received_at < p.start_at OR r.received_at > p.end_at
           ),
           rejected AS (
             SELECT DISTINCT client_request_id AS request_id FROM matched_legs
             WHERE role IN ('prefill', 'unified') AND input_length_rejection(error)
           ),
           ceiling AS (
             SELECT coalesce(max(threshold_tokens), $default) AS tokens FROM prefill_limits
           )
           SELECT count(*) FILTER (WHERE o.before), count(*) FILTER (WHERE NOT o.before),
                  count(*) FILTER (WHERE o.answered
                                     AND (j.request_id IS NOT NULL OR o.prompt_tokens >= c.tokens)),
                  min(o.received_at), max(o.received_at)
           FROM outside o CROSS JOIN ceiling c
           LEFT JOIN rejected j ON j.request_id = o.request_id""",
        {"default": params.get("default_threshold_tokens")},
    )
    before, after, signature, first, last = found or (0, 0, 0, None, None)
    if not signature:
        return []
    span = counted_parts(
        (before, f"{before:,} before the analysis window (from {utc(first)})"),
        (after, f"{after:,} after it (to {utc(last)})"),
    )
    return [
        (
            "outside_window",
            f"Requests loaded outside the analysis window were not judged: {span}. {signature:,}"
            f" of them {'shows' if signature == 1 else 'show'} the defect's signature (a prefill"
            " rejection, or a prompt over every"
            " prefill node's limit, answered): widen [incident] start or end if the exposure"
            " may reach beyond the window.",
        )
    ]
