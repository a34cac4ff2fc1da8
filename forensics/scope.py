"""Notification scoping: who has to be told what, computed from the findings tables.

Two roles (DESIGN.md sections 6 and 7):

* **recipient** - a tenant that received foreign data: it has confirmed or likely affected
  responses that no exclusion matched. ``possible`` verdicts are not notified; they stay in
  ``affected_responses.csv`` and in the report as needing review.
* **source** - a tenant whose requests were read by a confirmed or likely affected response.
  This includes responses that went to an excluded recipient (a customer whose data reached the
  researcher is still told), but not exposures whose *source* request is itself excluded: that
  is our own or the researcher's data. A response reading its own tenant's earlier request is
  not a cross-tenant exposure and notifies nobody.

The result is also written to ``findings_notifications`` so the report and the CSV read one
source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case

NOTIFIED_VERDICTS = ("confirmed", "likely")
ROLES = ("recipient", "source")

NOTIFICATIONS_DDL = """CREATE OR REPLACE TABLE findings_notifications (
  tenant_id VARCHAR, role VARCHAR, responses BIGINT, first_at TIMESTAMPTZ,
  last_at TIMESTAMPTZ, confidence VARCHAR)"""

# Attribution confidences, best first: the one order for notifications and notices alike.
CONFIDENCE_ORDER = ("exact", "high", "medium", "low", "very_low")


def best_confidence(confidences: list[str]) -> str:
    """The most certain of several attribution confidences.

    >>> best_confidence(["very_low", "medium", "low"])
    'medium'
    """
    return min(
        confidences,
        key=lambda c: CONFIDENCE_ORDER.index(c) if c in CONFIDENCE_ORDER else len(CONFIDENCE_ORDER),
    )


# Best first. Recipients rank by verdict, sources by how exact the attribution was.
_RECIPIENT_SQL = """
SELECT tenant_id, 'recipient' AS role, count(DISTINCT request_id) AS responses,
       min(received_at) AS first_at, max(received_at) AS last_at,
       CASE WHEN bool_or(verdict = 'confirmed') THEN 'confirmed' ELSE 'likely' END AS confidence
FROM findings_affected
WHERE verdict IN ('confirmed', 'likely') AND excluded_by IS NULL
GROUP BY tenant_id
"""

_SOURCE_SQL = """
WITH notified AS (
  SELECT DISTINCT request_id, received_at FROM findings_affected
  WHERE verdict IN ('confirmed', 'likely')
)
SELECT e.source_tenant_id AS tenant_id, 'source' AS role,
       count(DISTINCT e.recipient_request_id) AS responses,
       min(n.received_at) AS first_at, max(n.received_at) AS last_at,
       $order[min(list_position($order, e.confidence))] AS confidence
FROM findings_exposures e
JOIN notified n ON n.request_id = e.recipient_request_id
WHERE e.source_excluded_by IS NULL
  AND e.source_tenant_id IS NOT NULL
  AND e.source_tenant_id IS DISTINCT FROM e.recipient_tenant_id
GROUP BY e.source_tenant_id
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
class Scope:
    """Who is notified, in a stable order (tenant id, then role).

    Attributes:
        notifications: every (tenant, role) row.
    """

    notifications: tuple[Notification, ...]

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


def require_findings(con: duckdb.DuckDBPyConnection) -> None:
    """Fail with a clear message when detection has not written its findings yet.

    Raises:
        ForensicsError: a findings table is missing.
    """
    have = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'findings_%'"
        ).fetchall()
    }
    from forensics.schema import FINDINGS_DDL

    missing = sorted(set(FINDINGS_DDL) - have)
    if missing:
        raise ForensicsError(
            f"the case database has no findings ({', '.join(missing)} missing): "
            "run `forensics detect CASE.toml` first"
        )


def scope_case(con: duckdb.DuckDBPyConnection, case: Case | None = None) -> Scope:
    """Compute who is notified and write ``findings_notifications``.

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
    require_findings(con)
    con.execute(NOTIFICATIONS_DDL)
    con.execute(f"INSERT INTO findings_notifications {_RECIPIENT_SQL}")
    con.execute(
        f"INSERT INTO findings_notifications {_SOURCE_SQL}", {"order": list(CONFIDENCE_ORDER)}
    )
    rows = con.execute(
        "SELECT tenant_id, role, responses, first_at, last_at, confidence "
        "FROM findings_notifications ORDER BY tenant_id, role"
    ).fetchall()
    return Scope(tuple(Notification(*r) for r in rows))
