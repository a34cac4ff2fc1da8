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


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def notice_context(con: duckdb.DuckDBPyConnection, scope: Scope, tenant_id: str) -> dict[str, Any]:
    """Everything one tenant's notice shows, loaded with filters on that tenant only.

    Args:
        con: the case database.
        scope: the notification scope (decides the roles).
        tenant_id: the tenant, unredacted.

    Returns:
        A template context: ``tenant``, ``recipient`` (or None) and ``source`` (or None).
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
    if "recipient" in roles:
        rows = _one(
            con,
            """SELECT request_id, received_at, prompt_tokens, verdict FROM findings_affected
               WHERE tenant_id = ? AND notified_verdict(verdict) AND excluded_by IS NULL
               ORDER BY received_at, request_id""",
            [tenant_id],
        )
        n = roles["recipient"]
        ctx["recipient"] = {
            "responses": n.responses,
            "first_at": iso(n.first_at),
            "last_at": iso(n.last_at),
            "confidence": n.confidence,
            "requests": [{**r, "received_at": iso(r["received_at"])} for r in rows],
        }
    if "source" in roles:
        rows = _one(
            con,
            """WITH notified AS (
                 SELECT request_id, min(received_at) AS received_at FROM findings_affected
                 WHERE notified_verdict(verdict) GROUP BY request_id)
               SELECT e.source_request_id AS request_id,
                      (SELECT min(q.received_at) FROM requests q
                        WHERE q.request_id = e.source_request_id AND q.tenant_id = ?)
                        AS received_at,
                      count(DISTINCT e.recipient_request_id) AS read_by,
                      min(n.received_at) AS first_read_at, max(n.received_at) AS last_read_at,
                      list(DISTINCT e.confidence) AS confidences
               FROM findings_exposures e JOIN notified n ON n.request_id = e.recipient_request_id
               WHERE e.source_tenant_id = ? AND e.source_excluded_by IS NULL
                 AND e.recipient_tenant_id IS DISTINCT FROM e.source_tenant_id
               GROUP BY e.source_request_id
               ORDER BY received_at NULLS LAST, e.source_request_id""",
            [tenant_id, tenant_id],
        )
        n = roles["source"]
        ctx["source"] = {
            "responses": n.responses,
            "first_at": iso(n.first_at),
            "last_at": iso(n.last_at),
            "confidence": n.confidence,
            "requests": [
                {
                    "request_id": r["request_id"],
                    "received_at": iso(utc(r["received_at"])),
                    "read_by": r["read_by"],
                    "first_read_at": iso(r["first_read_at"]),
                    "last_read_at": iso(r["last_read_at"]),
                    "confidence": best_confidence(r["confidences"]),
                }
                for r in rows
            ],
        }
    return ctx


def scrub_others(text: str, own: str, others: list[str]) -> str:
    """Free text (a case title) with every other tenant's id replaced by ``[redacted]``.

    >>> scrub_others("reported by acct_9", "acct_1", ["acct_1", "acct_9"])
    'reported by [redacted]'
    """
    for other in sorted((o for o in others if o and o != own), key=lambda o: (-len(o), o)):
        text = text.replace(other, "[redacted]")
    return text
