"""Per-tenant customer notices and their file names.

A notice is built from its own tenant's rows only: as recipient, that tenant's own affected
responses; as source, that tenant's own requests whose KV was read and how many responses read
each - never by whom. The queries cover every notified tenant at once (one per part of the
letters, so the cost does not grow with the number of tenants) and never select another
tenant's id, request id or name beside a tenant's rows; each context takes its own tenant's
rows from them, so no template change can leak another's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from forensics.report.csvsql import iso_sql, line_sql
from forensics.report.data import iso

if TYPE_CHECKING:
    import duckdb

    from forensics.scope import Notification, Scope

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


# Rows shown inline in a letter; longer request lists go only into the CSV beside it.
INLINE_ROWS = 10

# The columns of the CSV beside each letter: every request it concerns, in either role.
NOTICE_CSV_COLUMNS = (
    "role",
    "request_id",
    "received_at",
    "prompt_tokens",
    "verdict",
    "data_read",
    "read_by_customers",
    "read_by_ours",
    "read_by_own",
    "first_read_at",
    "last_read_at",
    "confidence",
)


def _csv_line(role: str, kinds: dict[str, str]) -> str:
    """The SQL of a request's line in the notice CSV: ``role``, then each column of
    :data:`NOTICE_CSV_COLUMNS` from the same-named column of ``q`` (of its kind, see
    :mod:`forensics.report.csvsql`), empty where ``kinds`` has none."""
    cells = [(f"q.{c}", kinds[c]) if c in kinds else ("NULL", "text") for c in NOTICE_CSV_COLUMNS]
    return line_sql([(f"'{role}'", "text")] + cells[1:])


# The notices' queries each cover every notified tenant at once ($tenants), ordered by tenant:
# one query per part of the letters, whatever the number of tenants. A letter's context is then
# built from its own tenant's rows only (OrderedGroups), so nothing of another tenant reaches it.

# Per affected response of a recipient: whose data it read, by kind of source, at notified
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
  WHERE e.recipient_tenant_id IN (SELECT unnest($tenants)) AND notified_confidence(e.confidence)
  GROUP BY e.recipient_request_id
)
SELECT * EXCLUDE (__at), {line} AS csv_line
FROM (
  SELECT a.tenant_id, a.request_id, {iso_received} AS received_at, a.prompt_tokens, a.verdict,
         CASE WHEN r.customers > 0 OR r.unknown > 0 THEN 'another customer'
              WHEN r.ours > 0 THEN 'non-customer traffic only'
              WHEN r.own > 0 THEN 'your own earlier requests only'
              ELSE 'not determined' END AS data_read,
         a.received_at AS __at
  FROM findings_affected a LEFT JOIN reads r USING (request_id)
  WHERE a.tenant_id IN (SELECT unnest($tenants)) AND notified_verdict(a.verdict)
    AND a.excluded_by IS NULL
  ORDER BY tenant_id, __at, request_id
) q
""".format(
    iso_received=iso_sql("a.received_at"),
    line=_csv_line(
        "recipient",
        {"request_id": "text", "received_at": "text", "prompt_tokens": "int"}
        | {"verdict": "text", "data_read": "text"},
    ),
)

# Per request of a source tenant whose data was read: by how many responses, split by who
# received them. Only the kind of reader is loaded, never which tenant it was.
_SOURCE_SQL = """
WITH notified AS (
  SELECT request_id, min(received_at) AS received_at FROM findings_affected
  WHERE notified_verdict(verdict) GROUP BY request_id
),
-- One row per source request and response that read it (exposures may name a pair twice):
-- who read it, when, and the most certain of the pair's confidences. Counting these rows
-- counts distinct readers without count(DISTINCT), whose hash tables DuckDB could not spill
-- at 100M requests (4.8M source requests read: out of memory under the 2 GB limit).
pairs AS (
  SELECT e.source_tenant_id AS tenant_id, e.source_request_id, e.recipient_request_id,
         any_value(n.received_at) AS read_at,
         -- the most certain: forensics.verdicts.best_confidence
         arg_min(e.confidence, confidence_rank(e.confidence)) AS confidence,
         any_value(e.recipient_tenant_id = e.source_tenant_id) AS own,
         any_value(e.recipient_excluded_by) AS recipient_excluded_by
  FROM findings_exposures e JOIN notified n ON n.request_id = e.recipient_request_id
  WHERE e.source_tenant_id IN (SELECT unnest($tenants)) AND e.source_excluded_by IS NULL
    AND notified_confidence(e.confidence)
  GROUP BY e.source_tenant_id, e.source_request_id, e.recipient_request_id
),
reads AS (
  SELECT tenant_id, source_request_id,
         count(*) FILTER (WHERE NOT own AND recipient_excluded_by IS NULL) AS read_by_customers,
         count(*) FILTER (WHERE NOT own AND recipient_excluded_by IS NOT NULL) AS read_by_ours,
         count(*) FILTER (WHERE own) AS read_by_own,
         min(read_at) FILTER (WHERE NOT own) AS first_at,
         max(read_at) FILTER (WHERE NOT own) AS last_at,
         arg_min(confidence, confidence_rank(confidence)) FILTER (WHERE NOT own) AS confidence
  FROM pairs
  GROUP BY tenant_id, source_request_id
  HAVING count(*) FILTER (WHERE NOT own) > 0
),
sent AS (
  SELECT request_id, tenant_id, received_at FROM findings_source_requests
  WHERE tenant_id IN (SELECT unnest($tenants))
)
SELECT * EXCLUDE (__at), {line} AS csv_line
FROM (
  SELECT x.tenant_id, x.source_request_id AS request_id, {iso_sent} AS received_at,
         x.read_by_customers, x.read_by_ours, x.read_by_own,
         {iso_first} AS first_read_at,
         {iso_last} AS last_read_at,
         x.confidence,
         s.received_at AS __at
  FROM reads x
  LEFT JOIN sent s ON s.request_id = x.source_request_id AND s.tenant_id = x.tenant_id
  ORDER BY tenant_id, __at NULLS LAST, request_id
) q
""".format(
    iso_sent=iso_sql("s.received_at"),
    iso_first=iso_sql("x.first_at"),
    iso_last=iso_sql("x.last_at"),
    line=_csv_line(
        "source",
        {"request_id": "text", "received_at": "text", "read_by_customers": "int"}
        | {"read_by_ours": "int", "read_by_own": "int", "first_read_at": "text"}
        | {"last_read_at": "text", "confidence": "text"},
    ),
)

# Per source tenant: distinct notified responses that read its data, by kind of reader.
_READERS_SQL = """
SELECT e.source_tenant_id AS tenant_id,
       count(DISTINCT e.recipient_request_id)
         FILTER (WHERE e.recipient_tenant_id IS DISTINCT FROM e.source_tenant_id
                   AND e.recipient_excluded_by IS NULL) AS customers,
       count(DISTINCT e.recipient_request_id)
         FILTER (WHERE e.recipient_tenant_id IS DISTINCT FROM e.source_tenant_id
                   AND e.recipient_excluded_by IS NOT NULL) AS ours,
       count(DISTINCT e.recipient_request_id)
         FILTER (WHERE e.recipient_tenant_id = e.source_tenant_id) AS own
FROM findings_exposures e
JOIN findings_affected a ON a.request_id = e.recipient_request_id AND notified_verdict(a.verdict)
WHERE e.source_tenant_id IN (SELECT unnest($tenants)) AND e.source_excluded_by IS NULL
  AND notified_confidence(e.confidence)
GROUP BY e.source_tenant_id
"""

# Which excluded traffic read a source tenant's data: the rule's reason, never a tenant.
_EXCLUDED_READERS_SQL = """
SELECT e.source_tenant_id AS tenant_id, x.reason,
       count(DISTINCT e.recipient_request_id) AS responses
FROM findings_exposures e
JOIN findings_affected a ON a.request_id = e.recipient_request_id AND notified_verdict(a.verdict)
JOIN findings_exclusions x ON x.name = split_part(e.recipient_excluded_by, ',', 1)
WHERE e.source_tenant_id IN (SELECT unnest($tenants)) AND e.source_excluded_by IS NULL
  AND e.recipient_excluded_by IS NOT NULL AND notified_confidence(e.confidence)
GROUP BY e.source_tenant_id, x.reason, x.ordinal
ORDER BY e.source_tenant_id, x.ordinal
"""

_PROFILE_SQL = """
SELECT tenant_id, name, contact FROM tenants WHERE tenant_id IN (SELECT unnest($tenants))
QUALIFY row_number() OVER (PARTITION BY tenant_id ORDER BY name, contact) = 1
"""


def _rows(cur) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# Rows fetched at a time when the letters' rows stream (memory holds one batch).
BATCH_ROWS = 10_000


def notice_contexts(
    con: duckdb.DuckDBPyConnection, scope: Scope, tenants: list[str] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every notified tenant's notice context, in tenant order: ``(tenant, context)``.

    Each part of the letters is one query over all the tenants (see above), so the cost does
    not grow with the number of tenants; each context is built from its own tenant's rows.

    Args:
        con: the case database.
        scope: the notification scope (decides the roles).
        tenants: only these (default: every notified tenant).

    Yields:
        The tenant (unredacted) and its template context: ``tenant``, ``recipient`` (or None)
        and ``source`` (or None). Each role holds its counts, its ``requests`` (every row,
        each with its ``csv_line`` for the CSV) and ``inline`` (whether the letter lists them
        or points to the CSV).
    """
    from forensics.db import cursor
    from forensics.sql import OrderedGroups

    wanted = sorted(set(scope.tenants if tenants is None else tenants))
    roles: dict[str, dict[str, Notification]] = {}
    for n in scope.notifications:
        roles.setdefault(n.tenant_id, {})[n.role] = n
    args = {"tenants": wanted}
    profiles = {r["tenant_id"]: r for r in _rows(con.execute(_PROFILE_SQL, args))}
    readers = {r["tenant_id"]: r for r in _rows(con.execute(_READERS_SQL, args))}
    excluded: dict[str, list[dict]] = {}
    for r in _rows(con.execute(_EXCLUDED_READERS_SQL, args)):
        excluded.setdefault(r.pop("tenant_id"), []).append(r)
    # Two result sets stream side by side: each needs its own cursor.
    rec_cur, src_cur = cursor(con), cursor(con)
    try:
        recipients = OrderedGroups(rec_cur.execute(_RECIPIENT_SQL, args), batch=BATCH_ROWS)
        sources = OrderedGroups(src_cur.execute(_SOURCE_SQL, args), batch=BATCH_ROWS)
        for tenant in wanted:
            own = roles.get(tenant, {})
            profile = profiles.get(tenant) or {}
            ctx: dict[str, Any] = {
                "tenant": {
                    "id": tenant,
                    "name": profile.get("name"),
                    "contact": profile.get("contact"),
                },
                "recipient": None,
                "source": None,
            }
            rec_rows, src_rows = recipients.take((tenant,)), sources.take((tenant,))
            if "recipient" in own:
                ctx["recipient"] = _recipient_part(own["recipient"], rec_rows)
            if "source" in own:
                counts = readers.get(tenant) or {"customers": 0, "ours": 0, "own": 0}
                ctx["source"] = _source_part(
                    own["source"], src_rows, counts, excluded.get(tenant, [])
                )
            yield tenant, ctx
    finally:
        rec_cur.close()
        src_cur.close()


def notice_context(con: duckdb.DuckDBPyConnection, scope: Scope, tenant_id: str) -> dict[str, Any]:
    """One tenant's notice context (see :func:`notice_contexts`)."""
    return next(notice_contexts(con, scope, [tenant_id]))[1]


def _recipient_part(n: Notification, rows: list[dict]) -> dict[str, Any]:
    kinds = {k: sum(1 for r in rows if r["data_read"] == k) for k in _READ_KINDS}
    return {
        "responses": n.responses,
        "first_at": iso(n.first_at),
        "last_at": iso(n.last_at),
        "confidence": n.confidence,
        "foreign": kinds["another customer"],
        "ours_only": kinds["non-customer traffic only"],
        "own_only": kinds["your own earlier requests only"],
        "undetermined": kinds["not determined"],
        "requests": rows,
        "inline": len(rows) <= INLINE_ROWS,
    }


def _source_part(
    n: Notification, rows: list[dict], counts: dict[str, Any], excluded: list[dict]
) -> dict[str, Any]:
    requests = rows  # formatted by the query: times as iso() writes them, the best confidence
    return {
        "responses": n.responses,
        "first_at": iso(n.first_at),
        "last_at": iso(n.last_at),
        "confidence": n.confidence,
        "read_by_customers": counts["customers"],
        "read_by_ours": counts["ours"],
        "read_by_own": counts["own"],
        "excluded_readers": excluded,
        "requests": requests,
        "inline": len(requests) <= INLINE_ROWS,
    }


_READ_KINDS = (
    "another customer",
    "non-customer traffic only",
    "your own earlier requests only",
    "not determined",
)


class Scrubber:
    """Replaces every tenant id but one's own in free text (a case title, the fix's basis).

    Built once for all the notices: one pattern over every id, longest first, so scrubbing a
    letter costs the same whether the case has ten tenants or ten thousand.

    >>> Scrubber(["acct_1", "acct_9", "acct_12"]).scrub("acct_9 and acct_12 by acct_1", "acct_12")
    '[redacted] and acct_12 by [redacted]'
    """

    def __init__(self, tenant_ids: Iterable[str]):
        import re

        ids = sorted({t for t in tenant_ids if t}, key=lambda t: (-len(t), t))
        self._pattern = re.compile("|".join(map(re.escape, ids))) if ids else None

    def scrub(self, text: str, own: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: m[0] if m[0] == own else "[redacted]", text)


def scrub_others(text: str, own: str, others: Iterable[str]) -> str:
    """Free text with every other tenant's id replaced by ``[redacted]`` (one letter's worth;
    :class:`Scrubber` serves many).

    >>> scrub_others("reported by acct_9", "acct_1", ["acct_1", "acct_9"])
    'reported by [redacted]'
    """
    return Scrubber(others).scrub(text, own)
