"""Read everything the outputs need from the case database, once, in stable orders.

Every list here is sorted on a total key so the same database always renders the same bytes.
Tenant ids pass through a :class:`~forensics.report.redact.Redactor` on the way in, so the
templates and CSV writers never see a raw id in a redacted report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.detect import ALERTS
from forensics.report.redact import Redactor
from forensics.sql import first_row, scalar
from forensics.status import evidence_outcomes
from forensics.verdicts import NOTIFIED_VERDICTS

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case


# The conclusions each kind of evidence carries, so a gap in it limits them (said in the
# summary's "evidence is incomplete" banner).
EVIDENCE_LIMITS = {
    "requests": "affected responses, recipient tenants and source tenants may be undercounted",
    "engine_legs": (
        "the engine's own signals (the prefill rejection, token mismatches) may be missed, and "
        "attribution falls back from the engine's legs to client times or temporal candidates"
    ),
    "pool_snapshots": (
        "prefill limits fall back to the default pool size ([detection].default_pool_tokens) "
        "where no snapshot covers a node, and a decode node's pool is replayed only from its "
        "first snapshot: responses that took their pages before it have temporal candidates, "
        "not page-level sources"
    ),
    "kv_allocations": "attribution falls back from the allocation log to the allocator replay",
    "tenants": "tenant names and contacts may be missing from the notices",
}
NOTIFIED = NOTIFIED_VERDICTS  # the verdicts that count as affected, as scoping defines them


def utc(value: Any) -> datetime | None:
    """An aware UTC datetime from a DuckDB value or ISO string (None stays None)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def iso(value: Any) -> str:
    """UTC ISO 8601 with ``Z``; ``""`` for None.

    Sub-second digits only when present: milliseconds when that is exact, else microseconds,
    so columns of times line up instead of ending in a ragged number of digits.

    >>> iso(datetime(2026, 9, 8, 14, 2, tzinfo=UTC))
    '2026-09-08T14:02:00Z'
    >>> iso("2026-09-08T16:02:00.250+02:00")
    '2026-09-08T14:02:00.250Z'
    >>> iso("2026-09-08T14:02:00.78086Z")
    '2026-09-08T14:02:00.780860Z'
    """
    dt = utc(value)
    if dt is None:
        return ""
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond % 1000:
        text += f".{dt.microsecond:06d}"
    elif dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return text + "Z"


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _json(value: Any, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


@dataclass
class ReportData:
    """Everything a report output shows, already redacted where asked.

    Attributes mirror the findings tables; see :func:`load_report_data`.
    """

    case_id: str
    title: str
    generated_at: datetime
    redacted: bool
    notifications: list[dict]
    review: list[dict]
    detectors: list[dict]
    exclusions: list[dict]
    exploitation: list[dict]
    coverage: list[dict]
    warnings: list[dict]
    evidence: list[dict]
    timeline: list[dict]
    case_facts: dict[str, Any]
    attribution_methods: dict[str, int]
    window: dict[str, str]
    exploitation_summary: dict[str, Any]
    coverage_summary: dict[str, Any] = field(default_factory=dict)
    # Tenants in the client log that no exclusion matched: what "of how many" counts against.
    customer_tenants: int = 0
    # Whether and when the cause was fixed (forensics.remediation), for the summary.
    fix: dict[str, Any] = field(default_factory=dict)
    # What the evidence can support (forensics.basis): headline, per-figure caveats.
    basis: dict[str, Any] = field(default_factory=dict)
    # The evidence that did not load whole (partial, failed, missing), each with the
    # conclusions it limits; empty when every file loaded whole. Filled from
    # forensics.status.evidence_outcomes, like ``evidence``.
    incomplete_evidence: list[dict] = field(default_factory=list)
    # Rejected rows by reason and the duplicates among them (see _data_quality).
    quality: dict[str, Any] = field(default_factory=dict)
    # The case-level tunables (forensics.parameters) with the value used and the default.
    tuning: list[dict] = field(default_factory=list)

    @property
    def alerts(self) -> list[dict]:
        """The warnings that head the summary (ALERTS), each with its title."""
        return [{"title": ALERTS[w["code"]], **w} for w in self.warnings if w["code"] in ALERTS]

    # Counts over the affected responses and exposures, computed in SQL: the rows themselves
    # stream into the CSVs (forensics.report.csvsql) and the timeline export, so the
    # report costs the same however many requests a signal flagged.
    counts: dict[str, Any] = field(default_factory=dict)
    # Affected responses to excluded traffic, per (tenant, exclusion).
    excluded_recipients: list[dict] = field(default_factory=list)

    @property
    def incomplete_evidence_summary(self) -> str:
        """What did not load, counted: "1 file is partial and 1 manifest pattern matched no
        file" ("" when the evidence is complete)."""
        phrases = {
            "partial": ("file is partial", "files are partial"),
            "failed": ("file failed to load", "files failed to load"),
            "missing": ("manifest pattern matched no file", "manifest patterns matched no file"),
        }
        parts = []
        for outcome, (one, many) in phrases.items():
            n = sum(1 for e in self.incomplete_evidence if e["outcome"] == outcome)
            if n:
                parts.append(f"{n:,} {one if n == 1 else many}")
        if len(parts) > 1:
            return ", ".join(parts[:-1]) + " and " + parts[-1]
        return "".join(parts)

    summary: dict[str, Any] = field(default_factory=dict)


def _tuning(used: dict[str, Any]) -> list[dict]:
    """Each case-level tunable with the value detection used and its default (detector
    parameters are shown with their detector)."""
    from forensics.parameters import PARAMETERS

    return [
        {
            "name": p.name,
            "owner": p.owner,
            "value": used.get(p.name, p.default),
            "default": p.default,
            "changed": p.name in used and used[p.name] != p.default,
            "description": p.description,
        }
        for p in PARAMETERS.values()
    ]


def all_tenant_ids(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Every tenant id the case mentions anywhere a report could show it."""
    sql = """
    SELECT tenant_id FROM findings_tenants UNION SELECT tenant_id FROM tenants
    UNION SELECT tenant_id FROM findings_affected
    UNION SELECT recipient_tenant_id FROM findings_exposures
    UNION SELECT source_tenant_id FROM findings_exposures
    UNION SELECT tenant_id FROM findings_excluded
    UNION SELECT tenant_id FROM findings_exploitation
    UNION SELECT tenant_id FROM findings_notifications
    UNION SELECT tenant_id FROM findings_review
    """
    return {r[0] for r in con.execute(sql).fetchall() if r[0] is not None}


def generation_time(
    con: duckdb.DuckDBPyConnection, case: Case, as_of: datetime | None
) -> datetime | None:
    """The report's "as of" time: the flag, the manifest's as_of or end, else the evidence.

    Never the wall clock: the same case must render the same bytes tomorrow.
    """
    for candidate in (as_of, case.as_of, case.end):
        if candidate is not None:
            return utc(candidate)
    row = first_row(
        con,
        "SELECT greatest(max(last_at), (SELECT max(received_at) FROM findings_affected)) "
        "FROM evidence",
    )
    return utc(row[0]) if row and row[0] is not None else None


def _display_path(path: str, folder: Path) -> str:
    # Paths relative to the manifest keep the manifest.json identical across checkouts. A
    # relative path is already relative to the case folder (that is how a manifest's files and
    # patterns are recorded): resolving it against the working directory would make the output
    # depend on where the command ran.
    if not Path(path).is_absolute():
        return Path(path).as_posix()
    try:
        return Path(path).resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return Path(path).as_posix()


def load_report_data(
    con: duckdb.DuckDBPyConnection, case: Case, generated_at: datetime, red: Redactor
) -> ReportData:
    """Read the findings, evidence and case facts into one :class:`ReportData`.

    Args:
        con: the case database (findings and ``findings_notifications`` present).
        case: the case manifest.
        generated_at: the report's as-of time (UTC).
        red: the redactor applied to every tenant id and free-text field.

    Returns:
        The report data, lists sorted on total keys.
    """
    tx = red.text
    notifications, review = _scope(con, red)
    detectors, exclusions, coverage, warnings = _method(con, tx)
    exploitation = _exploitation(con, red)
    evidence, incomplete = _evidence(con, case, tx)
    facts, methods, window, expl_summary = _facts(con, case, tx)
    data = ReportData(
        case_id=case.id,
        title=tx(case.title) or "",
        generated_at=generated_at,
        redacted=red.active,
        notifications=notifications,
        review=review,
        detectors=detectors,
        exclusions=exclusions,
        exploitation=exploitation,
        coverage=coverage,
        warnings=warnings,
        evidence=evidence,
        timeline=_timeline(con, case),
        case_facts=facts,
        attribution_methods=methods,
        window=window,
        exploitation_summary=expl_summary,
        coverage_summary=_coverage_summary(facts.get("coverage")),
        tuning=_tuning(facts.get("parameters") or {}),
        fix=_fix(con, case, tx),
        customer_tenants=scalar(con, "SELECT count(*) FROM findings_tenants WHERE customer"),
        basis=_basis(facts.get("evidence_basis"), tx),
        incomplete_evidence=incomplete,
        quality=_data_quality(con, case.folder, tx),
        counts=_counts(con),
        excluded_recipients=_excluded_recipients(con, red),
    )
    data.summary = _summary(data)
    return data


AFFECTED_ROWS_SQL = """
SELECT request_id, tenant_id, received_at, prompt_tokens, threshold_tokens, verdict, signals,
       excluded_by, model, prefill_node, decode_node, dp_rank
FROM findings_affected"""
AFFECTED_ORDER = "q.received_at, q.request_id"

EXPOSURE_ROWS_SQL = """
SELECT e.recipient_request_id, e.recipient_tenant_id, e.source_request_id, e.source_tenant_id,
       e.method, e.tokens, e.confidence, e.rank, e.recipient_excluded_by, e.source_excluded_by,
       a.received_at AS recipient_at
FROM findings_exposures e
LEFT JOIN (SELECT request_id, min(received_at) AS received_at
           FROM findings_affected GROUP BY request_id) a
  ON a.request_id = e.recipient_request_id"""
EXPOSURE_ORDER = """q.recipient_at NULLS LAST, q.recipient_request_id, q.method, q.rank NULLS LAST,
         q.source_request_id, q.source_tenant_id, q.tokens"""

# "Not excluded" as the outputs read it: no exclusion name at all.
_KEPT = "coalesce(excluded_by, '') = ''"


def _counts(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The summary's counts over affected responses and exposures, in SQL."""
    row = first_row(
        con,
        f"""SELECT
              count(*) FILTER (WHERE notified_verdict(verdict) AND {_KEPT}),
              count(*) FILTER (WHERE verdict = 'confirmed' AND {_KEPT}),
              count(*) FILTER (WHERE verdict = 'likely' AND {_KEPT}),
              count(*) FILTER (WHERE notified_verdict(verdict) AND NOT {_KEPT}),
              count(*) FILTER (WHERE verdict = 'possible' AND {_KEPT}),
              count(*),
              min(received_at) FILTER (WHERE notified_verdict(verdict)),
              max(received_at) FILTER (WHERE notified_verdict(verdict))
            FROM findings_affected""",
    )
    keys = ("affected", "confirmed", "likely", "affected_excluded", "possible", "rows")
    counts: dict[str, Any] = dict(zip(keys, row[:6], strict=True))
    counts["first_affected"], counts["last_affected"] = utc(row[6]), utc(row[7])
    counts["exposures"], counts["affected_foreign"] = first_row(
        con,
        """SELECT count(*),
                  count(DISTINCT recipient_request_id) FILTER (
                    WHERE notified_confidence(confidence)
                      AND source_tenant_id IS DISTINCT FROM recipient_tenant_id
                      AND coalesce(recipient_excluded_by, '') = '')
           FROM findings_exposures""",
    )
    return counts


def _excluded_recipients(con: duckdb.DuckDBPyConnection, red: Redactor) -> list[dict]:
    """Notified responses that went to excluded traffic, per (tenant, exclusion), sorted after
    redaction."""
    rows = _rows(
        con,
        f"""SELECT tenant_id, excluded_by, count(*) AS responses FROM findings_affected
            WHERE notified_verdict(verdict) AND NOT {_KEPT}
            GROUP BY tenant_id, excluded_by""",
    )
    out = [
        {
            "tenant_id": red.tenant(r["tenant_id"]) or "",
            "excluded_by": r["excluded_by"],
            "responses": r["responses"],
        }
        for r in rows
    ]
    return sorted(out, key=lambda r: (r["tenant_id"], r["excluded_by"]))


def _scope(con: duckdb.DuckDBPyConnection, red: Redactor) -> tuple[list[dict], list[dict]]:
    """Who is notified and who is reviewed, in a stable order after redaction."""
    t, tx = red.tenant, red.text
    notifications = _rows(
        con,
        """SELECT tenant_id, role, responses, first_at, last_at, confidence
           FROM findings_notifications""",
    )
    for n in notifications:
        n["tenant_id"] = t(n["tenant_id"])
    # Sort after redaction: pseudonyms must not leak the order of the real ids.
    notifications.sort(key=lambda n: (n["tenant_id"], n["role"]))

    review = _rows(
        con,
        """SELECT tenant_id, role, responses, first_at, last_at, confidence, reason, evidence
           FROM findings_review""",
    )
    for r in review:
        r["tenant_id"] = t(r["tenant_id"]) if r["tenant_id"] is not None else None
        r["reason"], r["evidence"] = tx(r["reason"]), tx(r["evidence"])
    review.sort(key=lambda r: (r["tenant_id"] is not None, r["tenant_id"] or "", r["role"]))
    return notifications, review


def _method(con: duckdb.DuckDBPyConnection, tx) -> tuple[list[dict], ...]:
    """What ran and how: detectors, exclusion rules, log coverage, warnings."""
    detectors = _rows(
        con,
        """SELECT detector_id, title, severity, description, parameters, hits
           FROM findings_detectors ORDER BY ordinal NULLS LAST, detector_id""",
    )
    for d in detectors:
        params = _json(d["parameters"], {})
        d["parameters"] = {k: params[k] for k in sorted(params)} if isinstance(params, dict) else {}
        d["description"] = tx(d["description"])
        d["hits"] = d["hits"] or 0

    exclusions = _rows(
        con,
        """SELECT name, reason, rule, requests_matched, affected_matched, tenants_matched
           FROM findings_exclusions ORDER BY ordinal NULLS LAST, name""",
    )
    for x in exclusions:
        x["rule"] = tx(x["rule"])
        x["reason"] = tx(x["reason"])

    coverage = _rows(
        con,
        """SELECT scope, node, rows, first_at, last_at, gap_count, largest_gap_s, detail
           FROM findings_coverage ORDER BY scope, node NULLS FIRST, first_at""",
    )
    for c in coverage:
        c["detail"] = tx(c["detail"])

    warnings = _rows(con, "SELECT code, message FROM findings_warnings ORDER BY code, message")
    for w in warnings:
        w["message"] = tx(w["message"])
    return detectors, exclusions, coverage, warnings


def _exploitation(con: duckdb.DuckDBPyConnection, red: Redactor) -> list[dict]:
    """The per-tenant exploitation assessment, strongest first."""
    t, tx = red.tenant, red.text
    exploitation = _rows(
        con,
        """SELECT tenant_id, score, level, reasons, over_threshold_attempts,
                  affected_responses, excluded_by
           FROM findings_exploitation""",
    )
    for x in exploitation:
        x["tenant_id"] = t(x["tenant_id"])
        reasons = _json(x["reasons"], [])
        x["reasons"] = [tx(str(r)) for r in (reasons if isinstance(reasons, list) else [reasons])]
        x["score"] = float(x["score"] or 0.0)
    exploitation.sort(key=lambda x: (-x["score"], x["tenant_id"] or ""))
    return exploitation


def _evidence(con: duckdb.DuckDBPyConnection, case: Case, tx) -> tuple[list[dict], list[dict]]:
    """Every evidence file with its outcome, and those that did not load whole."""
    evidence = [
        {
            "path": _display_path(o.path, case.folder),
            "sha256": o.sha256,
            "bytes": o.bytes,
            "kind": o.kind,
            "format": o.format,
            "rows_read": o.rows_read,
            "rows_loaded": o.rows_loaded,
            "rows_rejected": o.rows_rejected,
            "first_at": o.first_at,
            "last_at": o.last_at,
            "outcome": o.outcome,
            # A decoder's or parser's words may quote the file's content.
            "reason": tx(o.reason),
            "rows_lost": o.rows_lost,
            "entry": o.entry,
        }
        for o in evidence_outcomes(con)
    ]
    # Display paths can differ from the recorded ones: sort again, keeping the library's order
    # among equals (sorted() is stable).
    evidence.sort(key=lambda ev: (ev["path"], ev["sha256"] or ""))
    incomplete = [
        dict(
            ev,
            limits=EVIDENCE_LIMITS.get(
                str(ev["kind"]), "conclusions drawn from it may be incomplete"
            ),
        )
        for ev in evidence
        if ev["outcome"] != "loaded"
    ]
    return evidence, incomplete


def _facts(con: duckdb.DuckDBPyConnection, case: Case, tx) -> tuple[dict, dict, dict, dict]:
    """The case-level statements of detection: facts, attribution methods, the window and the
    exploitation conclusion."""
    facts = {
        r["key"]: _json(r["value"], None)
        for r in _rows(con, "SELECT key, value FROM findings_case ORDER BY key")
    }
    methods = facts.get("attribution_methods") or {}
    methods = (
        {str(k): int(v) for k, v in sorted(methods.items())} if isinstance(methods, dict) else {}
    )
    window = _window(facts.get("window"), case)
    stated = facts.get("exploitation")
    expl: dict[str, Any] = stated if isinstance(stated, dict) else {}
    expl_summary = {
        "conclusion": tx(str(expl.get("conclusion") or "No exploitation assessment was made.")),
        "level": str(expl.get("level") or "none"),
        "basis": [tx(str(b)) for b in (expl.get("basis") or [])],
    }
    return facts, methods, window, expl_summary


# Conflicting duplicates the report lists one by one; all of them are in the rejects table.
DUPLICATES_SHOWN = 50


def _data_quality(con: duckdb.DuckDBPyConnection, folder: Path, tx) -> dict[str, Any]:
    """What did not load as a fact: rejected rows by kind, column and reason (with the first
    example), and the duplicates. Exact duplicates are counted; conflicting ones (an event
    already loaded, told differently) are listed, since they are evidence of a retry, a
    replayed log or tampering."""
    from forensics.status import duplicate_rejects, reject_groups

    paths = [r[0] for r in con.execute("SELECT DISTINCT path FROM rejects ORDER BY 1").fetchall()]

    def shown(where: str) -> str:
        # Paths as the evidence table shows them (relative to the case folder).
        for path in paths:
            if where.startswith(path + ":"):
                return _display_path(path, folder) + where[len(path) :]
        return where

    groups = [
        {
            "kind": g.kind,
            "column": g.column,
            "reason": tx(g.reason),
            "rows": g.rows,
            "example": tx(shown(g.example)),
        }
        for g in reject_groups(con)
    ]
    dups = duplicate_rejects(con, DUPLICATES_SHOWN)
    return {
        "rejects": groups,
        "rejected": sum(g["rows"] for g in groups),
        "exact_duplicates": dups.exact,
        "conflicting_duplicates": dups.conflicting,
        "conflicts": [
            {"kind": k, "where": tx(shown(f"{path}:{row}")), "reason": tx(reason)}
            for k, path, row, reason in dups.shown
        ],
    }


def _fix(con: duckdb.DuckDBPyConnection, case: Case, tx) -> dict[str, Any]:
    """The remediation statement: the same one the notices give."""
    from forensics.remediation import remediation_status

    r = remediation_status(con, case)
    return {
        "fixed": r.fixed,
        "fixed_at": r.fixed_at,
        "basis": tx(r.basis),
        "last_affected_at": r.last_affected_at,
        "still_limited": [{"node": n, "limit": lim} for n, lim in r.still_limited],
    }


def _basis(value: Any, tx) -> dict[str, Any]:
    """Detection's evidence basis, with a headline; an old database without one is whole."""
    from forensics.basis import EvidenceBasis

    if not isinstance(value, dict):
        return {"headline": "", "caveats": {}, "can_clear": True, "missing": []}
    basis = EvidenceBasis(
        rows=value.get("rows") or {},
        missing=list(value.get("missing") or []),
        caveats={k: tx(str(v)) for k, v in (value.get("caveats") or {}).items()},
        can_clear=bool(value.get("can_clear", True)),
        unknown_tenant_responses=int(value.get("unknown_tenant_responses") or 0),
    )
    return {
        "headline": basis.headline(),
        "caveats": basis.caveats,
        "can_clear": basis.can_clear,
        "missing": basis.missing,
        "unknown_tenant_responses": basis.unknown_tenant_responses,
    }


def _coverage_summary(value: Any) -> dict[str, Any]:
    """Detection's statement on log coverage, or a plain one when it made none."""
    if isinstance(value, dict) and value.get("statement"):
        return {"level": str(value.get("level") or "unknown"), "statement": str(value["statement"])}
    return {"level": "unknown", "statement": "No coverage statement was recorded."}


def _window(value: Any, case: Case) -> dict[str, str]:
    if isinstance(value, dict) and (value.get("start") or value.get("end")):
        return {
            "start": iso(value.get("start")),
            "end": iso(value.get("end")),
            "basis": "the exposure window detection used",
        }
    if case.start or case.end:
        return {
            "start": iso(case.start),
            "end": iso(case.end),
            "basis": "[incident] start and end of the case manifest",
        }
    return {"start": "", "end": "", "basis": "no window was set: all evidence was considered"}


def _timeline(con: duckdb.DuckDBPyConnection, case: Case) -> list[dict]:
    events = [
        {"at": utc(ev.at), "source": "manifest", "event": ev.event, "fix": ev.fix}
        for ev in case.timeline
    ]
    ends = {
        label: _rows(
            con,
            f"""SELECT request_id, received_at, verdict, excluded_by FROM findings_affected
                WHERE notified_verdict(verdict) ORDER BY {order} LIMIT 1""",
        )
        for label, order in (
            ("First", "received_at ASC NULLS LAST, request_id ASC"),
            ("Last", "received_at DESC NULLS FIRST, request_id DESC"),
        )
    }
    for label, a in ends.items():
        for row in a:
            row["received_at"] = utc(row["received_at"])
            how = row["verdict"]
            if row["excluded_by"]:
                how += f", excluded traffic: {row['excluded_by']}"
            events.append(
                {
                    "at": row["received_at"],
                    "source": "findings",
                    "event": f"{label} affected response ({how}): request {row['request_id']}",
                }
            )
    changes = _rows(
        con,
        """WITH s AS (
             SELECT node, observed_at, max_total_num_tokens, max_req_input_len,
                    lag(max_total_num_tokens) OVER w AS prev_pool,
                    lag(max_req_input_len) OVER w AS prev_input,
                    row_number() OVER w AS n
             FROM pool_snapshots
             WINDOW w AS (PARTITION BY node ORDER BY observed_at, source_row, evidence_id))
           SELECT node, observed_at, max_total_num_tokens, max_req_input_len,
                  prev_pool, prev_input FROM s
           WHERE n > 1 AND (max_total_num_tokens IS DISTINCT FROM prev_pool
                            OR max_req_input_len IS DISTINCT FROM prev_input)
           ORDER BY observed_at, node""",
    )
    for c in changes:
        parts = []
        if c["max_total_num_tokens"] != c["prev_pool"]:
            parts.append(
                f"max_total_num_tokens {_num(c['prev_pool'])} → {_num(c['max_total_num_tokens'])}"
            )
        if c["max_req_input_len"] != c["prev_input"]:
            parts.append(
                f"max_req_input_len {_num(c['prev_input'])} → {_num(c['max_req_input_len'])}"
            )
        events.append(
            {
                "at": utc(c["observed_at"]),
                "source": "pool snapshots",
                "event": f"Configuration change on {c['node']}: " + ", ".join(parts),
            }
        )
    source_order = {"manifest": 0, "findings": 1, "pool snapshots": 2}
    events.sort(key=lambda e: (e["at"], source_order[str(e["source"])], e["event"]))
    return events


def _num(value: Any) -> str:
    return "unset" if value is None else f"{value:,}"


def _summary(d: ReportData) -> dict[str, Any]:
    c = d.counts
    recipients = [n for n in d.notifications if n["role"] == "recipient"]
    sources = [n for n in d.notifications if n["role"] == "source"]
    methods = ", ".join(f"{m} ({n})" for m, n in d.attribution_methods.items()) or "none"
    return {
        **{k: c[k] for k in ("affected", "confirmed", "likely", "affected_excluded")},
        **{k: c[k] for k in ("possible", "rows", "exposures", "affected_foreign")},
        "recipients": len(recipients),
        "sources": len(sources),
        "review": len(d.review),
        # Tenants named as candidate sources only (a recipient's review rows are its possible
        # responses, counted apart).
        "candidate_sources": len(
            {r["tenant_id"] for r in d.review if r["tenant_id"] and r["role"] == "source"}
        ),
        "methods": methods,
        "notified_tenants": len({n["tenant_id"] for n in d.notifications}),
        "both_roles": len({n["tenant_id"] for n in recipients} & {n["tenant_id"] for n in sources}),
        "customer_tenants": d.customer_tenants,
        # The exposure actually observed: first and last confirmed or likely response, any
        # traffic (the analysis window is wider).
        "first_affected": c["first_affected"],
        "last_affected": c["last_affected"],
    }
