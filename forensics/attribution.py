"""Source attribution: whose KV each affected response read.

Three methods, the best one each decode rank's evidence allows (DESIGN.md section 6):

1. ``allocation_log`` (confidence ``exact``): ``kv_allocations`` name the pages of every
   allocation, so the last writer of each stale page is known.
2. ``allocator_replay`` (``high`` from engine legs, ``medium`` from client times only): the
   rank's page pool is replayed from its request timeline with SGLang's PD allocator rule —
   freed pages are parked, merged and sorted ascending when the free list runs short, and an
   allocation takes the lowest free ids.
3. ``temporal`` (``low``, then ``very_low``): every request on the same node (and rank) that
   released its KV within the overlap window before the victim took its pages, newest first,
   then each other tenant's latest earlier release on that node (see ``_temporal``).

Both page-level methods track *writers*, not owners: a normal request writes every page it
holds; a victim writes only its first page and the pages of its generated tokens, so the rest of
its reservation keeps the earlier writer's content and can leak it again to a later victim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb
    import numpy as np

SQL_DIR = Path(__file__).resolve().parent / "sql"


@dataclass
class AttributionResult:
    methods: dict[str, int] = field(default_factory=dict)  # method -> exposures written
    warnings: list[tuple[str, str]] = field(default_factory=list)


class PagePool:
    """One decode rank's KV page pool under SGLang's PD allocator, with page writers.

    Pages are numbered 1..P (page 0 is reserved). The free list is always ascending: it starts
    as 1..P and is only ever rebuilt by sorting. Freed pages wait in a release list until an
    allocation finds the free list too short.

    >>> pool = PagePool(pages=6)
    >>> pool.alloc("a", 3).tolist(), pool.alloc("b", 2).tolist()
    ([1, 2, 3], [4, 5])
    >>> pool.free("a"); pool.alloc("c", 2).tolist()  # 1 page left: merge, lowest ids first
    [1, 2]
    """

    def __init__(self, pages: int):
        import numpy as np

        self.np = np
        self.total = pages
        self.free_pages = np.arange(1, pages + 1, dtype=np.int64)
        self.pos = 0  # free_pages[pos:] are free; an allocation is a slice, not a copy
        self.released: list[np.ndarray] = []
        self.held: dict[Any, np.ndarray] = {}
        self.writer = np.full(pages + 1, -1, dtype=np.int64)
        self.shortfalls = 0  # allocations the replayed pool could not satisfy in full

    def _merge(self) -> None:
        np = self.np
        self.free_pages = np.sort(np.concatenate([self.free_pages[self.pos :], *self.released]))
        self.pos = 0
        self.released = []

    def alloc(self, key: Any, n_pages: int) -> np.ndarray:
        """Take ``n_pages`` pages for ``key``: the head of the free list, merging if short."""
        if n_pages > len(self.free_pages) - self.pos:
            self._merge()
        if n_pages > len(self.free_pages) - self.pos:
            # The logs say this allocation happened; the replayed pool disagrees, so the replay
            # has drifted from the real engine (missing frees, unknown start state).
            self.shortfalls += 1
            n_pages = len(self.free_pages) - self.pos
        pages = self.free_pages[self.pos : self.pos + n_pages]
        self.pos += n_pages
        self.held[key] = pages
        return pages

    def take(self, key: Any, pages: np.ndarray) -> np.ndarray:
        """Record an allocation whose pages are known (allocation log)."""
        self.held[key] = pages
        return pages

    def free(self, key: Any) -> None:
        pages = self.held.pop(key, None)
        if pages is not None and len(pages):
            self.released.append(pages)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def stale_read(
    pool: PagePool,
    pages: np.ndarray,
    victim: int,
    prompt_tokens: int,
    completion_tokens: int,
    page_size: int,
) -> dict[int, int]:
    """What a victim reads, then what it overwrites. Returns {writer index: stale pages}.

    The victim's prompt occupies allocation indices 0..ceil(N/page)-1; only index 0 came from
    prefill. Indices 1.. hold whatever their last writer left. Afterwards the victim has written
    index 0 and the pages of its generated tokens (positions N..N+C-1), nothing else.
    """
    np = pool.np
    prompt_pages = _ceil_div(max(prompt_tokens, 1), page_size)
    stale = pages[1:prompt_pages]
    writers = pool.writer[stale]
    writers = writers[(writers >= 0) & (writers != victim)]
    found: dict[int, int] = {}
    if len(writers):
        ids, counts = np.unique(writers, return_counts=True)
        found = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    pool.writer[pages[0:1]] = victim
    first_gen = prompt_tokens // page_size
    last_gen = _ceil_div(prompt_tokens + completion_tokens, page_size)
    pool.writer[pages[first_gen:last_gen]] = victim
    return found


def attribute(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> AttributionResult:
    """Fill findings_exposures for every confirmed or likely affected response."""
    from forensics.detect import run_sql_file
    from forensics.schema import FINDINGS_DDL

    con.execute(FINDINGS_DDL["findings_exposures"])
    run_sql_file(con, SQL_DIR / "timeline.sql")
    result = AttributionResult()
    victims = con.execute(
        """SELECT a.request_id, a.tenant_id, t.node, t.dp_rank, t.alloc_at, t.source_table,
                  t.prompt_tokens, t.completion_tokens, a.decode_node
           FROM findings_affected a
           LEFT JOIN decode_timeline t ON t.request_id = a.request_id
           WHERE a.verdict IN ('confirmed', 'likely')
           ORDER BY a.request_id"""
    ).fetchall()
    if not victims:
        return result
    no_node = [v for v in victims if v[2] is None and v[8] is None]
    if no_node:
        result.warnings.append(
            (
                "victims_without_node",
                f"{len(no_node)} affected responses have no decode node: their sources cannot be"
                " attributed (no exposure rows for them).",
            )
        )
    groups: dict[tuple, list] = {}
    for v in victims:
        node = v[2] or v[8]
        if node is not None:
            groups.setdefault((node, v[3]), []).append(v)

    rows: list[tuple] = []
    temporal_victims: list[str] = []
    for (node, rank), members in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or -1)):
        method, why = _choose_method(con, node, rank, members)
        if method == "temporal":
            temporal_victims += [m[0] for m in members]
            if why:
                result.warnings.append(("temporal_fallback", f"{node} rank {rank}: {why}"))
            continue
        replayed, warning = _replay(con, node, rank, members, method)
        rows += replayed
        if warning:
            result.warnings.append(("replay_drift", f"{node} rank {rank}: {warning}"))
        if warning or any(m[5] != "engine_legs" for m in members):
            # An approximate replay (client times only, or a pool that drifted) may miss a
            # writer: add the temporal candidates of any tenant it did not name.
            temporal_victims += [m[0] for m in members]
    if rows:
        _insert_exposures(con, rows)
    if temporal_victims:
        _temporal(con, temporal_victims, params)
    _mark_excluded(con)
    result.methods = dict(
        con.execute(
            "SELECT method, count(*) FROM findings_exposures GROUP BY method ORDER BY method"
        ).fetchall()
    )
    return result


def _choose_method(con, node: str, rank, members: list) -> tuple[str, str | None]:
    """allocation_log where the node has one, else allocator_replay where the pool is known."""
    has_log = con.execute(
        """SELECT count(*) FROM kv_allocations
           WHERE node = $node AND (dp_rank = $rank OR ($rank IS NULL AND dp_rank IS NULL))""",
        {"node": node, "rank": rank},
    ).fetchone()[0]
    if has_log:
        return "allocation_log", None
    pool = con.execute(
        "SELECT max(dp_size), count(*) FROM decode_limits WHERE node = $node", {"node": node}
    ).fetchone()
    if not pool[1]:
        return "temporal", "no pool snapshot for this decode node, so its pool cannot be replayed"
    if rank is None and (pool[0] or 1) > 1:
        return "temporal", "no dp_rank recorded and the node has several ranks"
    return "allocator_replay", None


_GROUP = "node = $node AND (dp_rank = $rank OR ($rank IS NULL AND dp_rank IS NULL))"


def _replay(con, node: str, rank, members: list, method: str) -> tuple[list[tuple], str | None]:
    """Replay one decode rank's pool and return exposure rows for its victims.

    DuckDB builds and orders the event list (pool starts, frees, allocations); Python only walks
    it, so the cost is one pass over the rank's requests.
    """
    import numpy as np

    args = {"node": node, "rank": rank}
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE replay_rows AS
            SELECT row_number() OVER (ORDER BY alloc_at, request_id) - 1 AS idx, *
            FROM decode_timeline WHERE {_GROUP} AND alloc_at IS NOT NULL""",
        args,
    )
    timeline = con.execute(
        """SELECT request_id, tenant_id, prompt_tokens, completion_tokens, source_table, free_at
           FROM replay_rows ORDER BY idx"""
    ).fetchall()
    # Events in engine order: at one instant a pool (re)start first, then frees, then
    # allocations, each in request-id order.
    starts = """SELECT epoch_us(observed_at) AS us, 0 AS kind, NULL::VARCHAR AS rid,
                       NULL::BIGINT AS idx, pool_tokens, page_size,
                       NULL::BIGINT[] AS firsts, NULL::BIGINT[] AS counts
                FROM decode_limits WHERE node = $node"""
    if method == "allocation_log":
        moves = """SELECT epoch_us(k."at"), CASE k.op WHEN 'alloc' THEN 2 ELSE 1 END,
                           k.request_id, any_value(t.idx), NULL, NULL,
                           list(k.first_page ORDER BY k.first_page),
                           list(k.page_count ORDER BY k.first_page)
                    FROM kv_allocations k LEFT JOIN replay_rows t USING (request_id)
                    WHERE k.node = $node
                      AND (k.dp_rank = $rank OR ($rank IS NULL AND k.dp_rank IS NULL))
                    GROUP BY k."at", k.op, k.request_id"""
    else:
        moves = """SELECT epoch_us(alloc_at), 2, request_id, idx, NULL, NULL, NULL, NULL
                   FROM replay_rows
                   UNION ALL
                   SELECT epoch_us(free_at), 1, request_id, idx, NULL, NULL, NULL, NULL
                   FROM replay_rows WHERE free_at IS NOT NULL"""
    events = con.execute(
        f"SELECT kind, rid, idx, pool_tokens, page_size, firsts, counts FROM ({starts} "
        f"UNION ALL {moves}) ORDER BY us, kind, rid NULLS FIRST",
        args if method == "allocation_log" else {"node": node},
    ).fetchall()

    victims = {m[0]: m for m in members}
    pool: PagePool | None = None
    page_size = 1
    exposures: list[tuple] = []
    shortfalls = 0
    for kind, rid, i, pool_tokens, new_page_size, firsts, counts in events:
        if kind == 0:
            if pool is not None:
                shortfalls += pool.shortfalls
            page_size = new_page_size
            pool = PagePool(pool_tokens // page_size)
            continue
        if pool is None:
            continue  # activity before any snapshot of the pool: nothing to replay against
        if kind == 1:
            pool.free(rid)
            continue
        if firsts is not None:
            pages = pool.take(
                rid,
                np.concatenate(
                    [
                        np.arange(f, f + c, dtype=np.int64)
                        for f, c in zip(firsts, counts, strict=True)
                    ]
                ),
            )
        elif i is not None:
            row = timeline[i]
            pages = pool.alloc(rid, _ceil_div(row[2] + row[3], page_size))
        else:
            continue
        if i is None:
            continue  # an allocation with no request record: its pages keep their writers
        if rid in victims:
            row = timeline[i]
            for writer, n in stale_read(pool, pages, i, row[2], row[3], page_size).items():
                src = timeline[writer]
                exposures.append(
                    (
                        rid,
                        victims[rid][1],
                        src[0],
                        src[1],
                        method,
                        n * page_size,
                        _confidence(method, row[4]),
                        None,
                        src[5],
                    )
                )
        else:
            pool.writer[pages] = i
    if pool is not None:
        shortfalls += pool.shortfalls
    warning = None
    if shortfalls:
        warning = (
            f"{shortfalls} allocations did not fit the replayed pool; the logs are"
            " incomplete or the pool was not empty when they begin, so sources are"
            " approximate"
        )
    unknown = sum(1 for row in timeline if row[1] is None)
    if unknown:
        # Without the client record a leg's generated tokens are unknown, so its allocation
        # size is a guess and every later allocation on the rank may be shifted.
        warning = (
            f"{unknown} decode legs have no client record (tenant and generated tokens"
            " unknown), so the replayed pool is approximate" + (f"; {warning}" if warning else "")
        )
    exposures.sort(key=lambda e: (e[0], -e[5], e[2]))
    return exposures, warning


def _insert_exposures(con, rows: list[tuple]) -> None:
    """Bulk insert through Arrow (row-by-row inserts cost seconds per thousand rows)."""
    import pyarrow as pa

    names = [
        "recipient_request_id",
        "recipient_tenant_id",
        "source_request_id",
        "source_tenant_id",
        "method",
        "tokens",
        "confidence",
        "rank",
        "source_released_at",
    ]
    exposure_rows = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})  # noqa: F841
    con.execute(
        """INSERT INTO findings_exposures
           SELECT recipient_request_id, recipient_tenant_id, source_request_id,
                  source_tenant_id, method, tokens, confidence, rank::INTEGER,
                  source_released_at::TIMESTAMPTZ, NULL, NULL
           FROM exposure_rows"""
    )


def _confidence(method: str, source_table: str) -> str:
    if method == "allocation_log":
        return "exact"
    return "high" if source_table == "engine_legs" else "medium"


def _temporal(con, victims: list[str], params: dict[str, Any]) -> None:
    """Rank the requests whose KV may have been left in the pages a victim read.

    Without the pool, the allocator cannot be replayed and a stale page may have been written
    at any time since the node started (the lowest pages are reused constantly, higher ones may
    sit untouched for days). So the candidates are two tiers, both from the victim's node (and
    rank when known) and released before it took its pages:

    - every request released within the overlap window, newest first (confidence ``low``);
    - beyond the window, each other tenant's latest release, newest first (``very_low``), so
      no tenant that could have been read is left out (source-tenant recall stays whole).
    """
    from forensics.detect import run_sql_file

    run_sql_file(
        con, SQL_DIR / "temporal.sql", {"victims": victims, "window_s": params["overlap_window_s"]}
    )


def _mark_excluded(con) -> None:
    """Carry exclusion marks onto both ends of every exposure."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE excluded_names AS
           SELECT request_id, string_agg(exclusion, ',' ORDER BY exclusion) AS names
           FROM findings_excluded GROUP BY request_id"""
    )
    con.execute(
        """CREATE OR REPLACE TABLE findings_exposures AS
           SELECT x.* EXCLUDE (recipient_excluded_by, source_excluded_by),
                  r.names AS recipient_excluded_by, s.names AS source_excluded_by
           FROM findings_exposures x
           LEFT JOIN excluded_names r ON r.request_id = x.recipient_request_id
           LEFT JOIN excluded_names s ON s.request_id = x.source_request_id
           ORDER BY x.recipient_request_id, x.rank NULLS FIRST, x.tokens DESC,
                    x.source_request_id"""
    )
