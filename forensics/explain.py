"""Everything the case knows about one request: its records, signals, verdict and exposures.

:func:`explain_request` gathers the facts ``forensics explain`` tells as one story: the
client's record (or, with none, the engine's view), each engine leg, the limit in force when
the request arrived, every signal with the evidence rows behind it, the verdict and the rule
that gave it, the exclusions that matched, and every exposure in both directions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case


@dataclass
class Explanation:
    """One request as the case database tells it.

    Attributes:
        request: the client's record (``client_record`` True) or the engine's view of a
            request with no client record (``client_record`` False), with ``evidence_path``
            and ``source_row``.
        legs: its engine legs (matched by request id or bootstrap room), each with
            ``evidence_path`` and ``source_row``.
        signals: each signal with ``evidence`` (table, evidence_id, source_row, path) and
            ``leg``, the engine leg it cites (None when it cites none).
        verdict: its ``findings_affected`` row, or None when no detector flagged it.
        reason: why the verdict is what it is (the rule of ``sql/verdicts.sql`` that applied).
        exclusions: the names of the exclusion rules that matched it.
        exclusion_reasons: rule name -> the reason the manifest gives.
        limit: the prefill input limit in force when it arrived (``tokens``, ``source``, the
            prefill ``node``, the evidence row it comes from, the ``context`` ceiling); None
            when the case has none to tell (an engine-only request, no pool and no default).
        attribution: how completely its sources are known (``findings_attribution``), or None.
        as_recipient: the exposures whose stale KV it read, largest first.
        as_source: the exposures that read its KV.
        parameters: the detection parameters the findings were made with.
    """

    request: dict[str, Any]
    legs: list[dict[str, Any]] = field(default_factory=list)
    signals: list[dict[str, Any]] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    exclusions: list[str] = field(default_factory=list)
    as_recipient: list[dict[str, Any]] = field(default_factory=list)
    as_source: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    exclusion_reasons: dict[str, str] = field(default_factory=dict)
    limit: dict[str, Any] | None = None
    attribution: dict[str, Any] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _dicts(cur) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _engine_only(
    con: duckdb.DuckDBPyConnection, request_id: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An engine request with no client record, shaped like one (the engine's view of it),
    and its legs."""
    # The legs of one engine request share its engine key (rules.sql), the rule detection
    # groups them by; legs that belong to a client request are not this one's.
    legs = _dicts(
        con.execute(
            """SELECT l.*, e.path AS evidence_path FROM engine_legs l
               LEFT JOIN evidence e USING (evidence_id)
               WHERE engine_key(l.bootstrap_room, l.request_id) IN (
                       SELECT engine_key(bootstrap_room, request_id) FROM engine_legs
                       WHERE request_id = $id)
                 AND l.request_id NOT IN (SELECT request_id FROM legs_of_clients('leg_unmatched')
                                          WHERE client_request_id IS NOT NULL)
               ORDER BY l.started_at, l.role""",
            {"id": request_id},
        )
    )
    if not legs:
        return [], []
    decode = next((g for g in legs if g["role"] in ("decode", "unified")), legs[0])
    prefill = next((g for g in legs if g["role"] == "prefill"), {})
    tenant = con.execute(
        "SELECT any_value(tenant_id) FROM findings_affected WHERE request_id = $id",
        {"id": request_id},
    ).fetchone()
    return [
        {
            "request_id": request_id,
            "tenant_id": tenant[0] if tenant else None,
            "received_at": legs[0]["started_at"],
            "http_status": None,
            "prompt_tokens": decode.get("reserved_tokens") or decode.get("input_tokens") or 0,
            "completion_tokens": None,
            "ttft_ms": None,
            "prefill_node": prefill.get("node"),
            "decode_node": decode.get("node") if decode.get("role") != "prefill" else None,
            "dp_rank": decode.get("dp_rank"),
            "bootstrap_room": decode.get("bootstrap_room"),
            "evidence_path": decode["evidence_path"],
            "source_row": decode["source_row"],
            "client_record": False,
        }
    ], legs


def verdict_reason(verdict: dict[str, Any] | None, parameters: dict[str, Any]) -> str:
    """Why a request got its verdict, in the terms of ``sql/verdicts.sql`` (which decides it:
    this only names the rule that applied to the signals it has).

    >>> verdict_reason({"verdict": "likely", "signals": "over_pool", "note": None}, {})
    'the prompt was at or over the limit in force, and no engine record refutes it'
    >>> verdict_reason(None, {})
    'no detector flagged it'
    """
    if verdict is None:
        return "no detector flagged it"
    signals = set((verdict.get("signals") or "").split(","))
    long_prompt = parameters.get("long_prompt_tokens")
    others = sorted(signals - {"over_pool"})
    if verdict["verdict"] == "confirmed":
        if "prefill_rejected" in signals:
            return "the prefill logged the input-length rejection, yet the request was answered"
        agree = "agree" if len(others) > 1 else "agrees"
        return f"the prompt was at or over the limit in force, and {', '.join(others)} {agree}"
    if verdict["verdict"] == "likely":
        if "over_pool" in signals:
            return "the prompt was at or over the limit in force, and no engine record refutes it"
        if "over_pool_unplaced" in signals and "token_mismatch" not in signals:
            rest = sorted(signals - {"over_pool_unplaced"})
            agree = "agree" if len(rest) > 1 else "agrees"
            return (
                "the prompt was over the limit of some prefill node (which one took it is not"
                f" on record), and {', '.join(rest)} {agree}"
            )
        at_least = f" (at least {long_prompt:,} tokens)" if long_prompt else ""
        return f"an engine leg held far fewer tokens than a long prompt{at_least}"
    if verdict.get("note"):
        return verdict["note"]
    return f"{', '.join(sorted(signals))} alone: a reason to look, not proof of exposure"


def _limit(
    con: duckdb.DuckDBPyConnection, case: Case, request_id: str, parameters: dict[str, Any]
) -> dict[str, Any] | None:
    """The prefill limit in force for a request: the one lookup detection uses
    (``limits_in_force`` of ``sql/prepare.sql``), over the case's working views."""
    from forensics.detect import case_parameters, prepare

    params = parameters or case_parameters(case)
    prepare(con, params, model=case.model, start=case.start, end=case.end)
    rows = _dicts(
        con.execute(
            """SELECT l.threshold_tokens AS tokens, l.threshold_source AS source,
                      l.prefill_node AS node, l.context_ceiling AS context,
                      l.limit_evidence_id AS evidence_id, l.limit_source_row AS source_row,
                      e.path AS evidence_path
               FROM limits_in_force(1, $default_limit, $context, true) l
               LEFT JOIN evidence e ON e.evidence_id = l.limit_evidence_id
               WHERE l.request_id = $id""",
            {
                "default_limit": params.get("default_threshold_tokens"),
                "context": params.get("context_length"),
                "id": request_id,
            },
        )
    )
    return rows[0] if rows and rows[0]["tokens"] is not None else None


def explain_request(
    con: duckdb.DuckDBPyConnection, request_id: str, case: Case | None = None
) -> Explanation:
    """Collect one request's evidence rows and findings.

    With ``case``, the limit in force is looked up too (it builds detection's working views,
    which takes a moment on a large case).

    Raises:
        ForensicsError: the request id is not in the case, or detection has not run.
    """
    # Every lookup of a request's legs goes through the legs no client rid names (rules.sql).
    con.execute("CREATE OR REPLACE TEMP TABLE leg_unmatched AS FROM unmatched_legs()")
    found = _dicts(
        con.execute(
            """SELECT r.*, e.path AS evidence_path FROM requests r
           LEFT JOIN evidence e USING (evidence_id) WHERE request_id = $id""",
            {"id": request_id},
        )
    )
    for row in found:
        row["client_record"] = True
    legs: list[dict[str, Any]] = []
    if not found:
        found, legs = _engine_only(con, request_id)
    if not found:
        from forensics.ingest import evidence_in_place

        lying = evidence_in_place(con)
        if lying:
            # Read in place: the database holds only the rows behind the findings.
            here = con.execute("SELECT count(*) FROM requests").fetchone()
            raise ForensicsError(
                f"request {request_id!r} is not among the requests the findings name: this "
                "case's evidence was read in place by Spark, and the case database holds only "
                f"the rows behind its findings ({here[0] if here else 0:,} of "
                f"{lying.get('requests', 0):,} requests)"
            )
        raise ForensicsError(f"request {request_id!r} is not in this case")
    tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    if "findings_affected" not in tables:
        raise ForensicsError("no findings yet: run `forensics detect` on this case first")
    req = found[0]
    paths = dict(con.execute("SELECT evidence_id, path FROM evidence").fetchall())
    if req["client_record"]:
        legs = _dicts(
            con.execute(
                """SELECT l.* EXCLUDE (client_request_id), e.path AS evidence_path
               FROM legs_of_clients('leg_unmatched') l LEFT JOIN evidence e USING (evidence_id)
               WHERE l.client_request_id = $id
               ORDER BY l.started_at, l.role""",
                {"id": request_id},
            )
        )
    signals = _dicts(
        con.execute(
            """SELECT signal, detector_id, value, threshold, detail, evidence
           FROM findings_signals WHERE request_id = $id ORDER BY signal""",
            {"id": request_id},
        )
    )
    for s in signals:
        s["evidence"] = json.loads(s["evidence"]) if s["evidence"] else []
        for ev in s["evidence"]:
            ev["path"] = paths.get(ev.get("evidence_id"))
        cited = {
            (ev["evidence_id"], ev["source_row"])
            for ev in s["evidence"]
            if ev.get("table") == "engine_legs"
        }
        s["leg"] = next((g for g in legs if (g["evidence_id"], g["source_row"]) in cited), None)
    verdict = _dicts(
        con.execute(
            "SELECT verdict, signals, threshold_tokens, excluded_by, note FROM findings_affected"
            " WHERE request_id = $id",
            {"id": request_id},
        )
    )
    exclusions = [
        r[0]
        for r in con.execute(
            "SELECT exclusion FROM findings_excluded WHERE request_id = $id ORDER BY exclusion",
            {"id": request_id},
        ).fetchall()
    ]
    reasons = dict(con.execute("SELECT name, reason FROM findings_exclusions").fetchall())
    exposure_cols = """source_request_id, source_tenant_id, recipient_request_id,
                       recipient_tenant_id, method, tokens, confidence, rank,
                       source_excluded_by, recipient_excluded_by"""
    as_recipient = _dicts(
        con.execute(
            f"SELECT {exposure_cols} FROM findings_exposures WHERE recipient_request_id = $id"
            " ORDER BY tokens DESC, source_request_id",
            {"id": request_id},
        )
    )
    as_source = _dicts(
        con.execute(
            f"SELECT {exposure_cols} FROM findings_exposures WHERE source_request_id = $id"
            " ORDER BY recipient_request_id",
            {"id": request_id},
        )
    )
    attribution = _dicts(
        con.execute(
            "SELECT node, dp_rank, method, status, unknown_pages, note FROM findings_attribution"
            " WHERE recipient_request_id = $id",
            {"id": request_id},
        )
    )
    stored = con.execute("SELECT value FROM findings_case WHERE key = 'parameters'").fetchone()
    parameters = json.loads(stored[0]) if stored else {}
    the_verdict = verdict[0] if verdict else None
    limit = None
    if case is not None:
        limit = _limit(con, case, request_id, parameters)
    return Explanation(
        req,
        legs,
        signals,
        the_verdict,
        exclusions,
        as_recipient,
        as_source,
        reason=verdict_reason(the_verdict, parameters),
        exclusion_reasons={name: reasons.get(name) or "" for name in exclusions},
        limit=limit,
        attribution=attribution[0] if attribution else None,
        parameters=parameters,
    )
