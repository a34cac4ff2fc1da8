"""Whether and when the cause was fixed, from the manifest's timeline and the pool snapshots.

Three kinds of evidence, each stated as what it is:

- a ``[[timeline]]`` event marked ``fix = true`` (the responder's own record of the patch);
- the pool snapshots: the moment from which no prefill node's input limit was set by its pool
  below the advertised context (the condition of the incident), if the snapshots show one;
- the last affected response in the logs.

The statement never claims a fix the evidence does not show: without a marked event or pool
evidence it says the logs do not establish one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from forensics.sql import scalar

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case


@dataclass(frozen=True)
class Remediation:
    """What the case can say about the fix.

    Attributes:
        fixed: True when a marked event or the pool snapshots show the cause removed.
        fixed_at: when (UTC), else None.
        basis: what ``fixed_at`` rests on (the event text, or the pool snapshots).
        last_affected_at: the last confirmed or likely affected response in the logs.
        still_limited: prefill nodes whose last snapshot still shows a pool-bound limit, with it.
    """

    fixed: bool
    fixed_at: datetime | None
    basis: str
    last_affected_at: datetime | None
    still_limited: tuple[tuple[str, int], ...] = ()


def pool_fixed_at(
    con: duckdb.DuckDBPyConnection, context_length: int | None
) -> tuple[datetime | None, tuple[tuple[str, int], ...]]:
    """When every prefill node's limit stopped being pool-bound, and the nodes where it never did.

    Returns ``(None, nodes)`` when some node's last snapshot is still pool-bound, and
    ``(None, ())`` when no snapshot was ever pool-bound (nothing to fix in the pools).
    """
    rows = con.execute(
        """WITH s AS (
             SELECT node, observed_at,
                    snapshot_input_limit(max_req_input_len, max_total_num_tokens,
                                         coalesce(context_length, $ctx)) AS limit_tokens,
                    coalesce(context_length, $ctx) AS ctx
             FROM pool_snapshots WHERE coalesce(role, 'prefill') IN ('prefill', 'unified')),
           flagged AS (
             SELECT node, observed_at, limit_tokens,
                    ctx IS NOT NULL AND pool_bound(limit_tokens, ctx) AS bound
             FROM s),
           per_node AS (
             SELECT node, max(observed_at) FILTER (WHERE bound) AS last_bound,
                    arg_max(bound, observed_at) AS still_bound,
                    arg_max(limit_tokens, observed_at) AS last_limit
             FROM flagged GROUP BY node),
           cleared AS (
             SELECT p.node, min(f.observed_at) AS cleared_at
             FROM per_node p JOIN flagged f
               ON f.node = p.node AND f.observed_at > p.last_bound AND NOT f.bound
             GROUP BY p.node)
           SELECT p.node, p.last_bound, p.still_bound, p.last_limit, c.cleared_at
           FROM per_node p LEFT JOIN cleared c USING (node)
           WHERE p.last_bound IS NOT NULL
           ORDER BY p.node""",
        {"ctx": context_length},
    ).fetchall()
    if not rows:
        return None, ()
    still = tuple((node, int(limit)) for node, _, bound, limit, _ in rows if bound)
    if still:
        return None, still
    return max(r[4] for r in rows), ()


def remediation_status(con: duckdb.DuckDBPyConnection, case: Case) -> Remediation:
    """State whether and when the cause was fixed (see the module docstring)."""
    # TIMESTAMPTZ values come back aware, in the connection's UTC zone.
    last = scalar(
        con, "SELECT max(received_at) FROM findings_affected WHERE notified_verdict(verdict)"
    )
    marked = [ev for ev in case.timeline if ev.fix]
    pool_at, still = pool_fixed_at(con, case.context_length)
    if marked:
        event = marked[-1]
        return Remediation(True, event.at, event.event, last, still)
    if pool_at is not None:
        return Remediation(
            True,
            pool_at,
            "pool snapshots: from then on no prefill node's input limit was set by a KV pool"
            " smaller than the context window",
            last,
        )
    return Remediation(False, None, "", last, still)
