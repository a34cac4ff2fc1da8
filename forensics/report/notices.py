"""Per-tenant customer notices and their file names.

A notice is built from a query that is filtered to one tenant before anything is rendered: as
recipient, that tenant's own affected responses; as source, that tenant's own requests whose
KV was read and how many responses read each - never by whom. Nothing about another tenant
(id, request id, name) is ever loaded into a notice's context, so no template change can leak it.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from forensics.report.data import iso, utc
from forensics.verdicts import best_confidence

if TYPE_CHECKING:
    import duckdb

    from forensics.scope import Scope

_UNSAFE = re.compile(r"[^a-z0-9_-]+")
_MAX_SLUG = 48
# Names some file systems refuse or treat specially, whatever the extension.
_RESERVED = {"con", "prn", "aux", "nul", "com1", "com2", "com3", "lpt1", "lpt2", "lpt3"}


def _hash8(tenant_id: str) -> str:
    return hashlib.sha256(tenant_id.encode("utf-8")).hexdigest()[:8]


def tenant_slug(tenant_id: str) -> str:
    """A safe file-name stem for a tenant: lowercase ``[a-z0-9-_]`` only.

    The id is never used as a path. When cleaning changed it (or left nothing), a short hash of
    the raw id is appended so two different tenants cannot end up with the same name.

    >>> tenant_slug("acct_42")
    'acct_42'
    >>> tenant_slug("../../etc/passwd")
    'etc-passwd-3754d6cb'
    """
    base = _UNSAFE.sub("-", tenant_id.lower()).strip("-_")[:_MAX_SLUG].strip("-_")
    if not base or base != tenant_id or base in _RESERVED:
        return f"{base}-{_hash8(tenant_id)}" if base else f"tenant-{_hash8(tenant_id)}"
    return base


def assign_slugs(tenant_ids: list[str]) -> dict[str, str]:
    """Slugs for a set of tenants, unique even when two tenants clean to the same stem.

    >>> sorted(assign_slugs(["a", "A"]).values())
    ['a', 'a-559aead0']
    """
    slugs = {t: tenant_slug(t) for t in sorted(set(tenant_ids))}
    seen: dict[str, list[str]] = {}
    for t, s in slugs.items():
        seen.setdefault(s, []).append(t)
    for s, owners in seen.items():
        if len(owners) > 1:
            for t in owners:
                slugs[t] = f"{s}-{_hash8(t)}"
    if len(set(slugs.values())) != len(slugs):
        # Only reachable through a hash-suffix collision; fall back to the full digest.
        slugs = {t: f"tenant-{hashlib.sha256(t.encode()).hexdigest()}" for t in slugs}
    return slugs


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: list | dict) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# Rows shown inline in a letter; longer request lists go only into the CSV beside it.
INLINE_ROWS = 10

# Per affected response of the tenant: whose data it read, by kind of source, at notified
# confidences (page-level evidence). "ours" is excluded traffic (researcher, our own tests).
_RECIPIENT_SQL = """
WITH reads AS (
  SELECT e.recipient_request_id AS request_id,
         count(*) FILTER (WHERE e.source_tenant_id IS NOT NULL
                          AND e.source_tenant_id <> e.recipient_tenant_id
                          AND e.source_excluded_by IS NULL) AS customers,
         count(*) FILTER (WHERE e.source_excluded_by IS NOT NULL
                          AND e.source_tenant_id IS DISTINCT FROM e.recipient_tenant_id) AS ours,
         count(*) FILTER (WHERE e.source_tenant_id = e.recipient_tenant_id) AS own,
         count(*) FILTER (WHERE e.source_tenant_id IS NULL) AS unknown
  FROM findings_exposures e
  WHERE e.recipient_tenant_id = $tenant AND notified_confidence(e.confidence)
  GROUP BY e.recipient_request_id
)
SELECT a.request_id, a.received_at, a.prompt_tokens, a.verdict,
       CASE WHEN r.customers > 0 OR r.unknown > 0 THEN 'another customer'
            WHEN r.ours > 0 THEN 'non-customer traffic only'
            WHEN r.own > 0 THEN 'your own earlier requests only'
            ELSE 'not determined' END AS data_read
FROM findings_affected a LEFT JOIN reads r USING (request_id)
WHERE a.tenant_id = $tenant AND notified_verdict(a.verdict) AND a.excluded_by IS NULL
ORDER BY a.received_at, a.request_id
"""

# Per request of the tenant whose data was read: by how many responses, split by who received
# them. Only the kind of reader is loaded, never which tenant it was.
_SOURCE_SQL = """
WITH notified AS (
  SELECT request_id, min(received_at) AS received_at FROM findings_affected
  WHERE notified_verdict(verdict) GROUP BY request_id
),
reads AS (
  SELECT e.source_request_id, e.recipient_request_id, n.received_at AS read_at, e.confidence,
         e.recipient_tenant_id = e.source_tenant_id AS own, e.recipient_excluded_by
  FROM findings_exposures e JOIN notified n ON n.request_id = e.recipient_request_id
  WHERE e.source_tenant_id = $tenant AND e.source_excluded_by IS NULL
    AND notified_confidence(e.confidence)
)
SELECT x.source_request_id AS request_id,
       (SELECT min(q.received_at) FROM requests q
         WHERE q.request_id = x.source_request_id AND q.tenant_id = $tenant) AS received_at,
       count(DISTINCT recipient_request_id)
         FILTER (WHERE NOT own AND recipient_excluded_by IS NULL) AS read_by_customers,
       count(DISTINCT recipient_request_id)
         FILTER (WHERE NOT own AND recipient_excluded_by IS NOT NULL) AS read_by_ours,
       count(DISTINCT recipient_request_id) FILTER (WHERE own) AS read_by_own,
       min(read_at) FILTER (WHERE NOT own) AS first_read_at,
       max(read_at) FILTER (WHERE NOT own) AS last_read_at,
       list(DISTINCT confidence) FILTER (WHERE NOT own) AS confidences
FROM reads x
GROUP BY x.source_request_id
HAVING count(*) FILTER (WHERE NOT own) > 0
ORDER BY received_at NULLS LAST, x.source_request_id
"""

# Which excluded traffic read the tenant's data: the rule's reason, never a tenant.
_EXCLUDED_READERS_SQL = """
SELECT x.reason, count(DISTINCT e.recipient_request_id) AS responses
FROM findings_exposures e
JOIN findings_affected a ON a.request_id = e.recipient_request_id AND notified_verdict(a.verdict)
JOIN findings_exclusions x ON x.name = split_part(e.recipient_excluded_by, ',', 1)
WHERE e.source_tenant_id = $tenant AND e.source_excluded_by IS NULL
  AND e.recipient_excluded_by IS NOT NULL AND notified_confidence(e.confidence)
GROUP BY x.reason, x.ordinal
ORDER BY x.ordinal
"""


def notice_context(con: duckdb.DuckDBPyConnection, scope: Scope, tenant_id: str) -> dict[str, Any]:
    """Everything one tenant's notice shows, loaded with filters on that tenant only.

    Args:
        con: the case database.
        scope: the notification scope (decides the roles).
        tenant_id: the tenant, unredacted.

    Returns:
        A template context: ``tenant``, ``recipient`` (or None) and ``source`` (or None).
        Each role holds its counts, its ``requests`` (every row, for the CSV) and ``inline``
        (whether the letter lists them or points to the CSV).
    """
    roles = {n.role: n for n in scope.notifications if n.tenant_id == tenant_id}
    profile = _one(
        con,
        "SELECT name, contact FROM tenants WHERE tenant_id = ? ORDER BY name, contact LIMIT 1",
        [tenant_id],
    )
    ctx: dict[str, Any] = {
        "tenant": {
            "id": tenant_id,
            "name": profile[0]["name"] if profile else None,
            "contact": profile[0]["contact"] if profile else None,
        },
        "recipient": None,
        "source": None,
    }
    args = {"tenant": tenant_id}
    if "recipient" in roles:
        rows = _one(con, _RECIPIENT_SQL, args)
        n = roles["recipient"]
        kinds = {k: sum(1 for r in rows if r["data_read"] == k) for k in _READ_KINDS}
        ctx["recipient"] = {
            "responses": n.responses,
            "first_at": iso(n.first_at),
            "last_at": iso(n.last_at),
            "confidence": n.confidence,
            "foreign": kinds["another customer"],
            "ours_only": kinds["non-customer traffic only"],
            "own_only": kinds["your own earlier requests only"],
            "undetermined": kinds["not determined"],
            "requests": [{**r, "received_at": iso(r["received_at"])} for r in rows],
            "inline": len(rows) <= INLINE_ROWS,
        }
    if "source" in roles:
        rows = _one(con, _SOURCE_SQL, args)
        n = roles["source"]
        requests = [
            {
                "request_id": r["request_id"],
                "received_at": iso(utc(r["received_at"])),
                "read_by_customers": r["read_by_customers"],
                "read_by_ours": r["read_by_ours"],
                "read_by_own": r["read_by_own"],
                "first_read_at": iso(r["first_read_at"]),
                "last_read_at": iso(r["last_read_at"]),
                "confidence": best_confidence(r["confidences"]),
            }
            for r in rows
        ]
        customers = _count_distinct(con, tenant_id, "AND e.recipient_excluded_by IS NULL")
        ours = _count_distinct(con, tenant_id, "AND e.recipient_excluded_by IS NOT NULL")
        own = _count_distinct(con, tenant_id, "", own=True)
        ctx["source"] = {
            "responses": n.responses,
            "first_at": iso(n.first_at),
            "last_at": iso(n.last_at),
            "confidence": n.confidence,
            "read_by_customers": customers,
            "read_by_ours": ours,
            "read_by_own": own,
            "excluded_readers": _one(con, _EXCLUDED_READERS_SQL, args),
            "requests": requests,
            "inline": len(requests) <= INLINE_ROWS,
        }
    return ctx


_READ_KINDS = (
    "another customer",
    "non-customer traffic only",
    "your own earlier requests only",
    "not determined",
)


def _count_distinct(con, tenant_id: str, extra: str, own: bool = False) -> int:
    """Distinct notified responses that read this tenant's data, by kind of reader."""
    relation = (
        "e.recipient_tenant_id = e.source_tenant_id"
        if own
        else "e.recipient_tenant_id IS DISTINCT FROM e.source_tenant_id"
    )
    # Only fixed SQL fragments are joined here; the tenant is a bound parameter.
    return con.execute(
        f"""SELECT count(DISTINCT e.recipient_request_id) FROM findings_exposures e
            JOIN findings_affected a
              ON a.request_id = e.recipient_request_id AND notified_verdict(a.verdict)
            WHERE e.source_tenant_id = $tenant AND e.source_excluded_by IS NULL
              AND notified_confidence(e.confidence) AND {relation} {extra}""",
        {"tenant": tenant_id},
    ).fetchone()[0]


def scrub_others(text: str, own: str, others: list[str]) -> str:
    """Free text (a case title) with every other tenant's id replaced by ``[redacted]``.

    >>> scrub_others("reported by acct_9", "acct_1", ["acct_1", "acct_9"])
    'reported by [redacted]'
    """
    for other in sorted((o for o in others if o and o != own), key=lambda o: (-len(o), o)):
        text = text.replace(other, "[redacted]")
    return text
