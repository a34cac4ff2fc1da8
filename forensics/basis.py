"""What the evidence can support: which kinds are missing and what that costs each figure.

A figure of zero is an all-clear only when the evidence that would have shown a non-zero one was
there. This module states, once per detection, which evidence kinds are missing and, for each
headline figure (affected responses, recipients, sources, exploitation), what it rests on and
what it cannot show. The report prints these beside the figures, so no count reads as stronger
than its evidence.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from forensics.sql import scalar

if TYPE_CHECKING:
    import duckdb

FIGURES = ("affected", "recipients", "sources", "exploitation")


@dataclass
class EvidenceBasis:
    """The evidence behind the headline figures.

    Attributes:
        rows: rows loaded per evidence kind.
        missing: evidence kinds that matter and have no rows, most important first.
        caveats: figure -> what it cannot show given the missing evidence (absent when whole).
        can_clear: whether a count of zero affected responses may be read as an all-clear.
        unknown_tenant_responses: notified affected responses whose tenant the logs do not name.
    """

    rows: dict[str, int]
    missing: list[str] = field(default_factory=list)
    caveats: dict[str, str] = field(default_factory=dict)
    can_clear: bool = True
    unknown_tenant_responses: int = 0

    @property
    def complete(self) -> bool:
        return not self.missing

    def headline(self) -> str:
        """One sentence for the top of the report (empty when nothing is missing).

        >>> print(EvidenceBasis(rows={}, missing=["requests"]).headline())
        Evidence missing: requests (the client request log). Each figure says what it cannot show.
        """
        if not self.missing:
            return ""
        names = ", ".join(f"{k} ({KIND_LABELS[k]})" for k in self.missing)
        return f"Evidence missing: {names}. Each figure says what it cannot show."


KIND_LABELS = {
    "requests": "the client request log",
    "engine_legs": "the engines' prefill and decode records",
    "prefill_legs": "the prefill engines' records",
    "decode_legs": "the decode engines' records",
    "prefill_snapshots": "the prefill nodes' pool limits",
    "decode_snapshots": "the decode nodes' pool sizes",
}


def _engine_sources(con: duckdb.DuckDBPyConnection, allocation_log: bool) -> str:
    """What the sources rest on without the client log, as attribution found it: a tenant only
    where the legs carry a label, and a replay that guessed only where a leg did not count its
    generated tokens (an SGLang decode leg does), so neither is claimed lost when it was not."""
    unnamed = _unnamed_sources(con)
    if not unnamed:
        named = "every source request read carries one"
    elif unnamed == 1:
        named = "1 source request read carries none, so its tenant is unknown"
    else:
        named = f"{unnamed:,} source requests read carry none, so their tenants are unknown"
    text = (
        f"Sources are engine request ids, named to a tenant only by a label on their legs; {named}"
    )
    if allocation_log:
        return text + " (pages from the allocation log)."
    from forensics.attribution import UNSETTLED_NOTE
    from forensics.terminal import plural

    approximate, unsettled = (
        scalar(
            con,
            "SELECT count(*) FROM findings_attribution WHERE status = 'approximate'"
            f" AND coalesce(note, '') {like} LIKE '{UNSETTLED_NOTE}%'",
        )
        for like in ("NOT", "")
    )
    if approximate:
        text += (
            ". Some generated tokens are unknown without it, so the replayed pool is"
            f" approximate for {approximate:,} affected"
            f" {'response, which also gets' if approximate == 1 else 'responses, which also get'}"
            " nearby releases as review candidates."
        )
    else:
        text += ". The decode legs count their generated tokens: the replay guessed none."
    if unsettled:
        text += (
            f" For {plural(unsettled, 'affected response')} what was read depends on what the"
            " logs do not settle (the queue order of legs admitted together, or whether a"
            " response judged possible was affected): the sources of both ways are named, those"
            " of one way only a confidence step lower."
        )
    return text


def evidence_basis(con: duckdb.DuckDBPyConnection) -> EvidenceBasis:
    """Count what was loaded and spell out what each headline figure can and cannot show.

    Runs after verdicts and exclusions (it counts affected responses whose tenant is unknown).
    ``kv_allocations`` is optional (few engines write it) and its absence costs nothing the
    replay does not recover, so it is never reported missing.
    """
    unknown_tenant_responses = scalar(
        con,
        "SELECT count(*) FROM findings_affected"
        " WHERE notified_verdict(verdict) AND tenant_id IS NULL AND excluded_by IS NULL",
    )
    rows = {
        "requests": scalar(con, "SELECT count(*) FROM requests"),
        "engine_legs": scalar(con, "SELECT count(*) FROM engine_legs"),
        "prefill_legs": scalar(
            con, "SELECT count(*) FROM engine_legs WHERE role IN ('prefill', 'unified')"
        ),
        "decode_legs": scalar(
            con, "SELECT count(*) FROM engine_legs WHERE role IN ('decode', 'unified')"
        ),
        "prefill_snapshots": scalar(
            con,
            "SELECT count(*) FROM pool_snapshots"
            " WHERE coalesce(role, 'prefill') IN ('prefill', 'unified')",
        ),
        "decode_snapshots": scalar(
            con,
            "SELECT count(*) FROM pool_snapshots"
            " WHERE coalesce(role, 'decode') IN ('decode', 'unified')",
        ),
    }
    allocation_log = scalar(con, "SELECT count(*) FROM kv_allocations") > 0
    missing = [k for k in KIND_LABELS if rows[k] == 0]
    if "engine_legs" in missing:
        # One side of the engines missing is said as such; both as the engine records.
        missing = [k for k in missing if k not in ("prefill_legs", "decode_legs")]
    basis = EvidenceBasis(
        rows=rows,
        missing=missing,
        unknown_tenant_responses=unknown_tenant_responses,
    )
    c = basis.caveats
    no_requests, no_legs = rows["requests"] == 0, rows["engine_legs"] == 0
    if no_requests and no_legs:
        basis.can_clear = False
        c["affected"] = (
            "Cannot be determined: neither a client request log nor engine records were"
            " loaded. Zero here means nothing was examined, not that nothing happened."
        )
        c["recipients"] = c["sources"] = "Cannot be determined without request records."
        c["exploitation"] = "Cannot be assessed without a client request log."
        return basis
    if no_requests:
        basis.can_clear = True  # engine records alone prove (or rule out) the bug path
        c["affected"] = (
            "From engine records alone: a prefill that logged the input-length rejection, a"
            " decode leg that received far less than it reserved, or a decode leg that reserved"
            " a prompt at or over the prefill limit in force, each followed by a decode leg that"
            " completed. latency_too_good needs the client log and did not run on these"
            " requests."
        )
        c["recipients"] = (
            "Tenants are named only where the engine records carry a tenant label;"
            f" {_responses(unknown_tenant_responses)} no tenant and "
            f"{'is' if unknown_tenant_responses == 1 else 'are'} on the review list until"
            " their request ids are mapped to tenants."
        )
        c["sources"] = _engine_sources(con, allocation_log)
        c["exploitation"] = (
            "Cannot be assessed: prompt lengths per tenant come from the client request log."
        )
    else:
        if unknown_tenant_responses:
            c["recipients"] = (
                f"{_responses(unknown_tenant_responses)} only engine records, no client"
                " record: the tenant is unknown (review list)."
            )
        unnamed = _unnamed_sources(con)
        if unnamed:
            c["sources"] = (
                f"{_sources(unnamed)} only engine records, no client record and no tenant"
                " label: their tenants are unknown, so this count is a floor."
            )
    if no_legs:
        c["affected"] = (
            "Rests on prompt lengths against the prefill limits (over_pool) and latency:"
            " without engine records no verdict is confirmed by what the engines did."
        )
        c["sources"] = (
            "Replayed from client times (confidence medium at best) or, where a decode pool is"
            " unknown, temporal candidates for review."
        )
    elif rows["decode_legs"] == 0:
        c["affected"] = (
            "No decode records: a request the client log lost cannot be shown answered, so its"
            " prefill rejection is only possible (review list); for the rest, verdicts rest on"
            " the client log and the prefill records."
        )
        c.setdefault(
            "sources",
            "Replayed from client times, not from decode records: confidence medium at best.",
        )
    elif rows["prefill_legs"] == 0:
        c["affected"] = (
            "No prefill records: no rejection can be seen; verdicts rest on the limits"
            " (over_pool), decode transfers and latency."
        )
    if rows["prefill_snapshots"] == 0 and not no_requests:
        c.setdefault(
            "affected",
            "Prefill limits come from [detection].default_pool_tokens and the limits logged in"
            " prefill rejections, not from the engines' own reports.",
        )
    if rows["decode_snapshots"] == 0:
        c["sources"] = (
            "No decode pool size is known, so no allocator can be replayed: every source is a"
            " temporal candidate on the review list and no tenant is notified as a source."
        )
    else:
        only = _candidates_only(con)
        if only:
            c["sources"] = f"{c['sources']} {only}" if "sources" in c else only
    return basis


def _candidates_only(con: duckdb.DuckDBPyConnection) -> str:
    """How many affected responses have only candidate sources, and why (the three commonest
    reasons attribution gave): none of those candidates is notified as a source, so a source
    count that leaves them out must say so. Empty when every response has page-level sources."""
    rows = con.execute(
        """SELECT t.note, count(*) AS n, sum(count(*)) OVER () AS total
           FROM findings_attribution t
           JOIN findings_affected a ON a.request_id = t.recipient_request_id
           WHERE notified_verdict(a.verdict) AND t.status = 'candidates'
           GROUP BY t.note ORDER BY n DESC, t.note LIMIT 3"""
    ).fetchall()
    if not rows:
        return ""
    total = int(rows[0][2])
    affected = scalar(
        con,
        """SELECT count(DISTINCT t.recipient_request_id) FROM findings_attribution t
           JOIN findings_affected a ON a.request_id = t.recipient_request_id
           WHERE notified_verdict(a.verdict)""",
    )
    why = "; ".join(f"{note or 'no reason recorded'} ({n:,})" for note, n, _ in rows)
    return (
        f"{total:,} of {affected:,} affected responses have candidate sources only, not"
        " page-level ones, so no tenant they may have read is notified as a source (the"
        f" candidates are on the review list): {why}."
    )


def _unnamed_sources(con: duckdb.DuckDBPyConnection) -> int:
    """Source requests read whose tenant no record names."""
    return scalar(
        con,
        "SELECT count(DISTINCT source_request_id) FROM findings_exposures"
        " WHERE source_tenant_id IS NULL",
    )


def _sources(n: int) -> str:
    """``n source request(s) read has/have``.

    >>> _sources(1), _sources(3)
    ('1 source request read has', '3 source requests read have')
    """
    return f"{n:,} source request read has" if n == 1 else f"{n:,} source requests read have"


def _responses(n: int) -> str:
    """``n affected response(s) has/have``.

    >>> _responses(1), _responses(3)
    ('1 affected response has', '3 affected responses have')
    """
    return f"{n:,} affected response has" if n == 1 else f"{n:,} affected responses have"


def record_basis(con: duckdb.DuckDBPyConnection, basis: EvidenceBasis) -> None:
    """Store the basis in findings_case for the report."""
    con.execute(
        "INSERT INTO findings_case VALUES ('evidence_basis', $v)",
        {"v": json.dumps(asdict(basis), sort_keys=True)},
    )
