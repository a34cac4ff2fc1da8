"""Notification scoping: who has to be told what, computed from the findings tables.

The decision is explicit and has two outcomes: **notify** or **review**.

Notified, in two roles:

* **recipient** - a tenant with confirmed or likely affected responses that no exclusion
  matched. ``possible`` verdicts are not notified.
* **source** - a tenant whose requests page-level evidence (allocation log or allocator replay,
  at confidence exact, high or medium) shows were read by a confirmed or likely response. This
  includes responses that went to an excluded recipient (a customer whose data reached the
  researcher is still told), but not exposures whose *source* request is itself excluded: that
  is our own or the researcher's data. A response reading its own tenant's earlier request is
  not a cross-tenant exposure and notifies nobody.

Review, each row with its reason: tenants named only as candidates (temporal proximity, or a
replay that had drifted), tenants with ``possible`` verdicts (a notified recipient's too: its
notice leaves them out), and affected responses or sources whose tenant the logs do not name.
A candidate is never told its data leaked; a responder decides.

Both lists are written to ``findings_notifications`` and ``findings_review`` so the report, the
CSVs and the notices read one source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case

# Recipients: tenants with a notified verdict, excluded traffic and unknown tenants left out.
_RECIPIENT_SQL = """
SELECT tenant_id, 'recipient' AS role, count(DISTINCT request_id) AS responses,
       min(received_at) AS first_at, max(received_at) AS last_at,
       verdict_at(min(verdict_rank(verdict))) AS confidence
FROM findings_affected
WHERE notified_verdict(verdict) AND excluded_by IS NULL AND tenant_id IS NOT NULL
GROUP BY tenant_id
"""

# Every cross-tenant read of a notified response whose source is not excluded traffic.
_READS_SQL = """
CREATE OR REPLACE TEMP TABLE scope_reads AS
WITH notified AS (
  SELECT request_id, min(received_at) AS received_at FROM findings_affected
  WHERE notified_verdict(verdict) GROUP BY request_id
)
SELECT e.source_tenant_id AS tenant_id, e.recipient_request_id, n.received_at, e.method,
       e.confidence, confidence_rank(e.confidence) AS confidence_rank,
       a.decode_node, a.dp_rank
FROM findings_exposures e
JOIN notified n ON n.request_id = e.recipient_request_id
LEFT JOIN (SELECT request_id, any_value(decode_node) AS decode_node,
                  any_value(dp_rank) AS dp_rank
           FROM findings_affected GROUP BY request_id) a
  ON a.request_id = e.recipient_request_id
WHERE e.source_excluded_by IS NULL
  -- A read of one's own earlier request is not cross-tenant; an unknown tenant on either side
  -- may be another tenant, so it stays.
  AND (e.source_tenant_id IS NULL OR e.recipient_tenant_id IS NULL
       OR e.source_tenant_id <> e.recipient_tenant_id)
"""

# Sources: tenants whose data page-level evidence shows was read, at a notified confidence.
_SOURCE_SQL = """
SELECT tenant_id, 'source' AS role, count(DISTINCT recipient_request_id) AS responses,
       min(received_at) AS first_at, max(received_at) AS last_at,
       confidence_at(min(confidence_rank)) AS confidence
FROM scope_reads
WHERE tenant_id IS NOT NULL AND notified_confidence(confidence)
GROUP BY tenant_id
"""

# Candidates: what is not notified but must not be dropped. Each row says why it is here.
_REVIEW_SQL = """
WITH candidate_sources AS (
  SELECT tenant_id, count(DISTINCT recipient_request_id) AS responses,
         min(received_at) AS first_at, max(received_at) AS last_at,
         confidence_at(min(confidence_rank)) AS confidence,
         string_agg(DISTINCT method, ', ' ORDER BY method) AS methods,
         string_agg(DISTINCT decode_node, ', ' ORDER BY decode_node) AS nodes
  FROM scope_reads
  WHERE tenant_id IS NOT NULL
    AND tenant_id NOT IN (SELECT tenant_id FROM findings_notifications WHERE role = 'source')
  GROUP BY tenant_id
),
-- A tenant notified for other responses is listed too: its notice leaves its possible
-- responses out, and a responder settles them before the notice goes.
possible AS (
  SELECT tenant_id, count(*) AS responses, min(received_at) AS first_at,
         max(received_at) AS last_at,
         string_agg(DISTINCT signals, '; ' ORDER BY signals) AS signals,
         tenant_id IN (SELECT tenant_id FROM findings_notifications WHERE role = 'recipient')
           AS notified
  FROM findings_affected
  WHERE verdict = 'possible' AND excluded_by IS NULL AND tenant_id IS NOT NULL
  GROUP BY tenant_id
),
unknown_recipients AS (
  SELECT count(*) AS responses, min(received_at) AS first_at, max(received_at) AS last_at
  FROM findings_affected
  WHERE notified_verdict(verdict) AND tenant_id IS NULL AND excluded_by IS NULL
),
unknown_possible AS (
  SELECT count(*) AS responses, min(received_at) AS first_at, max(received_at) AS last_at,
         string_agg(DISTINCT signals, '; ' ORDER BY signals) AS signals
  FROM findings_affected
  WHERE verdict = 'possible' AND tenant_id IS NULL AND excluded_by IS NULL
),
unknown_sources AS (
  SELECT count(DISTINCT recipient_request_id) AS responses, min(received_at) AS first_at,
         max(received_at) AS last_at, confidence_at(min(confidence_rank)) AS confidence
  FROM scope_reads WHERE tenant_id IS NULL AND notified_confidence(confidence)
)
SELECT tenant_id, 'source', responses, first_at, last_at, confidence,
       'candidate only: named by ' || methods || ' at confidence ' || confidence
         || ', never by page-level evidence at a notified confidence',
       format('{} response(s) on {} may have read its data', responses, nodes)
FROM candidate_sources
UNION ALL
SELECT tenant_id, 'recipient', responses, first_at, last_at, 'possible',
       CASE WHEN notified
            THEN 'possible verdicts beside its notified responses, left out of its notice: a'
              || ' weak signal alone, or one the engine''s own logs contradict'
            ELSE 'only possible verdicts: a weak signal alone, or one the engine''s own logs'
              || ' contradict' END,
       'signals: ' || signals
FROM possible
UNION ALL
SELECT NULL, 'recipient', responses, first_at, last_at, NULL,
       'tenant unknown: affected responses found in engine logs without a client record',
       format('{} response(s); map their request ids to tenants through the gateway logs',
              responses)
FROM unknown_recipients WHERE responses > 0
UNION ALL
SELECT NULL, 'recipient', responses, first_at, last_at, 'possible',
       'tenant unknown and only possible: engine records with no client record that do not'
         || ' settle whether a response went out (a prefill rejection with no decode leg)',
       format('{} request(s); signals: {}', responses, signals)
FROM unknown_possible WHERE responses > 0
UNION ALL
SELECT NULL, 'source', responses, first_at, last_at, confidence,
       'tenant unknown: stale pages last written by engine requests without a client record',
       format('{} response(s) read such pages; the source request ids are in exposures.csv',
              responses)
FROM unknown_sources WHERE responses > 0
"""


@dataclass(frozen=True)
class Notification:
    """One tenant in one role.

    Attributes:
        tenant_id: the customer account, unredacted.
        role: ``recipient`` or ``source``.
        responses: recipient - its affected responses; source - distinct responses that read
            its data.
        first_at: earliest of those responses (UTC).
        last_at: latest of those responses (UTC).
        confidence: recipient - best verdict (confirmed > likely); source - best attribution
            confidence (exact > high > medium > low > very_low).
    """

    tenant_id: str
    role: str
    responses: int
    first_at: datetime | None
    last_at: datetime | None
    confidence: str


@dataclass(frozen=True)
class ReviewItem:
    """A tenant (or an unknown one) that is a candidate, not notified for it, and why.

    Attributes:
        tenant_id: the tenant, or None when the logs do not name it.
        role: ``recipient`` or ``source``.
        responses: the affected responses concerned.
        first_at: earliest of those responses (UTC).
        last_at: latest of those responses (UTC).
        confidence: best attribution confidence (sources) or ``possible`` (recipients).
        reason: why it is a candidate and not notified.
        evidence: what the candidacy rests on.
    """

    tenant_id: str | None
    role: str
    responses: int
    first_at: datetime | None
    last_at: datetime | None
    confidence: str | None
    reason: str
    evidence: str


@dataclass(frozen=True)
class Scope:
    """Who is notified, in a stable order (tenant id, then role).

    Attributes:
        notifications: every (tenant, role) row.
    """

    notifications: tuple[Notification, ...]
    review: tuple[ReviewItem, ...] = ()

    @property
    def recipients(self) -> tuple[Notification, ...]:
        """Recipient rows only."""
        return tuple(n for n in self.notifications if n.role == "recipient")

    @property
    def sources(self) -> tuple[Notification, ...]:
        """Source rows only."""
        return tuple(n for n in self.notifications if n.role == "source")

    @property
    def tenants(self) -> tuple[str, ...]:
        """Every notified tenant once, sorted."""
        return tuple(sorted({n.tenant_id for n in self.notifications}))


def require_findings(con: duckdb.DuckDBPyConnection, *, scoped: bool = False) -> None:
    """Fail with a clear message when detection (and, with ``scoped``, scoping) has not
    written its tables yet.

    Raises:
        ForensicsError: a findings table is missing.
    """
    from forensics.schema import FINDINGS_DDL, SCOPE_DDL

    have = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'findings_%'"
        ).fetchall()
    }
    needed = set(FINDINGS_DDL) | (set(SCOPE_DDL) if scoped else set())
    missing = sorted(needed - have)
    if missing:
        raise ForensicsError(
            f"the case database has no findings ({', '.join(missing)} missing): "
            "run `forensics detect CASE.toml` first"
        )


def scope_case(con: duckdb.DuckDBPyConnection, case: Case | None = None) -> Scope:
    """Compute who is notified and who is reviewed; write ``findings_notifications`` and
    ``findings_review``.

    Args:
        con: the case database, with findings written by detection.
        case: the case (unused by the computation today; accepted so callers pass the same
            pair to every pipeline step).

    Returns:
        The notification scope, sorted by tenant id and role.

    Raises:
        ForensicsError: the findings tables are missing.

    Example:
        >>> from forensics.db import connect
        >>> from forensics.schema import FINDINGS_DDL
        >>> con = connect(":memory:")
        >>> for ddl in FINDINGS_DDL.values():
        ...     _ = con.execute(ddl)
        >>> _ = con.execute("INSERT INTO findings_affected (request_id, tenant_id, received_at,"
        ...     " verdict) VALUES ('r1', 't1', '2026-09-01T00:00:00Z', 'confirmed')")
        >>> [(n.tenant_id, n.role, n.responses) for n in scope_case(con).notifications]
        [('t1', 'recipient', 1)]
    """
    del case  # scoping depends on findings only
    from forensics.schema import SCOPE_DDL

    require_findings(con)
    for ddl in SCOPE_DDL.values():
        con.execute(ddl)
    con.execute(_READS_SQL)
    con.execute(f"INSERT INTO findings_notifications {_RECIPIENT_SQL}")
    con.execute(f"INSERT INTO findings_notifications {_SOURCE_SQL}")
    con.execute(f"INSERT INTO findings_review {_REVIEW_SQL}")
    return load_scope(con)


def load_scope(con: duckdb.DuckDBPyConnection) -> Scope:
    """The notification scope :func:`scope_case` wrote, read back without writing anything.

    Raises:
        ForensicsError: the findings tables are missing.
    """
    require_findings(con, scoped=True)
    rows = con.execute(
        "SELECT tenant_id, role, responses, first_at, last_at, confidence "
        "FROM findings_notifications ORDER BY tenant_id, role"
    ).fetchall()
    review = con.execute(
        "SELECT * FROM findings_review ORDER BY tenant_id NULLS FIRST, role"
    ).fetchall()
    return Scope(tuple(Notification(*r) for r in rows), tuple(ReviewItem(*r) for r in review))
