"""Source attribution: whose KV each affected response read.

Three methods, the best one each decode rank's evidence allows (docs/architecture.md, section 5):

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
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from forensics.replay import NEVER, RankReplay, replay_ranks
from forensics.replay import ceil_div as _ceil_div
from forensics.terminal import plural, utc
from forensics.verdicts import CONFIDENCE_ORDER

if TYPE_CHECKING:
    from collections.abc import Callable

    import duckdb
    import numpy as np

    from forensics.progress import StepProgress


class Victim(NamedTuple):
    """A notified affected response and where it took its decode pages."""

    request_id: str
    tenant_id: str | None
    node: str | None  # from the decode timeline (engine leg or client record)
    dp_rank: int | None
    alloc_at: datetime | None
    source_table: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    decode_node: str | None  # from the verdict row, when the timeline has none


class TimelineRow(NamedTuple):
    """One request of a decode rank's timeline, as the replay walks it."""

    request_id: str
    tenant_id: str | None
    prompt_tokens: int
    completion_tokens: int
    source_table: str
    free_at: datetime | None
    size_known: bool  # generated tokens from the client record or the engine's count
    admit_by: datetime | None  # timed by its arrival: the latest it can have had its pages
    # Its admission's queue order is not settled by the logs (timeline.sql): None, or the run.
    queue_run: int | None = None


class Exposure(NamedTuple):
    """One source an affected response read (a row of findings_exposures, before exclusion
    marks)."""

    recipient_request_id: str
    recipient_tenant_id: str | None
    source_request_id: str
    source_tenant_id: str | None
    method: str
    tokens: int
    confidence: str
    rank: int | None
    source_released_at: datetime | None


class AttributionStatus(NamedTuple):
    """How completely one affected response's sources are known (findings_attribution)."""

    recipient_request_id: str
    node: str | None
    dp_rank: int | None
    method: str | None
    status: str
    unknown_pages: int
    note: str | None


@dataclass
class AttributionResult:
    methods: dict[str, int] = field(default_factory=dict)  # method -> exposures written
    warnings: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class VictimStatus:
    """How completely a page-level method accounted for what one affected response read.

    Attributes:
        drifted: the replayed pool had already disagreed with the logs before this victim took
            its pages (an allocation that did not fit, or one whose size was a guess because
            its leg has no client record), or this victim's own allocation did not fit: page
            choice, and so the named writers, may be off.
        unknown_pages: stale pages the victim read whose last writer is not in the replayed
            history (written before the logs begin, or never written).
        unsettled: what it read differs between the replay's two passes (the two orders of a
            queue run, legs admitted together in an order the logs do not settle; responses
            judged possible writing as a victim or not): every writer either names is listed,
            those read one way only one confidence step lower, each with the larger amount.
    """

    drifted: bool = False
    unknown_pages: int = 0
    unsettled: bool = False


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
        self.guesses = 0  # allocations whose size was estimated (generated tokens unknown)

    def _merge(self) -> None:
        np = self.np
        self.free_pages = np.sort(np.concatenate([self.free_pages[self.pos :], *self.released]))
        self.pos = 0
        self.released = []

    def fits(self, n_pages: int) -> bool:
        """Whether ``n_pages`` pages can be taken now, merging the released pages in if the
        free list is short (as an allocation would).

        >>> pool = PagePool(pages=4)
        >>> _ = pool.alloc("a", 3); pool.fits(2)
        False
        >>> pool.free("a"); pool.fits(2)
        True
        """
        if n_pages > len(self.free_pages) - self.pos:
            self._merge()
        return n_pages <= len(self.free_pages) - self.pos

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


def attribute(
    con: duckdb.DuckDBPyConnection,
    params: dict[str, Any],
    progress: StepProgress | None = None,
) -> AttributionResult:
    """Fill findings_exposures and findings_attribution for every notified affected response.

    Each decode rank gets the best page-level method its evidence allows. Temporal candidates
    are added only where that method cannot account for what a victim read: no page-level
    method for the rank, or a replay that had drifted from the logs by the time the victim
    took its pages. A drifted replay's own exposures drop one confidence step. ``progress``
    is told of each decode rank before its sources are worked out.
    """
    from forensics.schema import FINDINGS_DDL
    from forensics.sql import run_sql_file

    con.execute(FINDINGS_DDL["findings_exposures"])
    con.execute(FINDINGS_DDL["findings_attribution"])
    run_sql_file(con, "timeline.sql")
    result = AttributionResult()
    victims = [
        Victim(*row)
        for row in con.execute(
            """SELECT a.request_id, a.tenant_id, t.node, t.dp_rank, t.alloc_at, t.source_table,
                      t.prompt_tokens, t.completion_tokens, a.decode_node
               FROM findings_affected a
               LEFT JOIN decode_timeline t ON t.request_id = a.request_id
               WHERE notified_verdict(a.verdict)
               ORDER BY a.request_id"""
        ).fetchall()
    ]
    if not victims:
        drop_working_tables(con)
        return result
    statuses: list[AttributionStatus] = []
    no_node = [v for v in victims if v.node is None and v.decode_node is None]
    if no_node:
        result.warnings.append(
            (
                "victims_without_node",
                f"{len(no_node)} affected responses have no decode node: their sources cannot be"
                " attributed (no exposure rows for them).",
            )
        )
        statuses += [
            AttributionStatus(v.request_id, None, None, None, "none", 0, "no decode node recorded")
            for v in no_node
        ]
    groups: dict[tuple[str, int | None], list[Victim]] = {}
    for v in victims:
        node = v.node or v.decode_node
        if node is not None:
            groups.setdefault((node, v.dp_rank), []).append(v)

    rows: list[Exposure] = []
    tables: list[Any] = []  # exposures of replayed ranks, as Arrow tables
    temporal_victims: list[str] = []  # no page-level method: every candidate tier
    drifted_victims: list[str] = []  # a replay that drifted: recent releases only
    unreplayed_on: dict[str, int] = {}  # node -> victims before its first pool snapshot
    # Ranks in the order the replay streams return them: node, then rank (none first).
    ordered = sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] is not None, g[0][1] or 0))
    methods, first_pool = _choose_methods(con, [key for key, _ in ordered])
    replayed_ranks = {
        key: {m.request_id: m for m in groups[key]}
        for key, (m, _) in methods.items()
        if m == "allocator_replay"
    }
    position = {key: done for done, (key, _) in enumerate(ordered)}

    def replaying(key: tuple[str, int | None]) -> None:
        if progress:
            where = key[0] if key[1] is None else f"{key[0]} rank {key[1]}"
            progress(
                f"Attribution: {_DOING['allocator_replay']} {where}", position[key], len(ordered)
            )

    # Responses the verdicts left possible that carry an over-limit signal: had they been
    # affected, they wrote only their first page and their answer, and the rest of their pages
    # held older KV. The replay tries them both ways (replay.replay_rank, ``maybe_victim``).
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE maybe_victims AS
            SELECT DISTINCT a.request_id AS maybe_id FROM findings_affected a
            JOIN findings_signals s ON s.request_id = a.request_id
            WHERE NOT notified_verdict(a.verdict) AND s.signal IN {MAYBE_SIGNALS}"""
    )
    # A rank with no timeline rows replays nothing.
    replays: dict[tuple[str, int | None], Any] = dict.fromkeys(replayed_ranks, (None, {}, None))
    # An engine that schedules the replay itself (Spark: one task per rank) runs the same
    # replay (rank_arrays, replay_rank, rank_exposures) where the ranks' rows are.
    replay_elsewhere = getattr(con, "replay_ranks", None)
    if replay_elsewhere is not None:
        if progress and replayed_ranks:
            progress(f"Attribution: replaying {len(replayed_ranks):,} decode ranks", 0, 0)
        replays.update(replay_elsewhere(replayed_ranks))
    else:
        for chunk in _rank_chunks(_replayed_spans(con, list(replayed_ranks))):
            # One chunk's streams at a time: memory follows the chunk, not the incident.
            streams = _ReplayStreams(con, chunk)
            chunk_ranks = {s.key: replayed_ranks[s.key] for s in chunk}
            replays.update(streams.replay_all(chunk_ranks, replaying))
            del streams
    for done, ((node, rank), members) in enumerate(ordered):
        method, why = methods[(node, rank)]
        if progress and method != "allocator_replay":
            where = node if rank is None else f"{node} rank {rank}"
            progress(f"Attribution: {_DOING[method]} {where}", done, len(ordered))
        if method == "temporal":
            temporal_victims += [m.request_id for m in members]
            if why:
                result.warnings.append(("temporal_fallback", f"{node} rank {rank}: {why}"))
            statuses += [
                AttributionStatus(m.request_id, node, rank, "temporal", "candidates", 0, why)
                for m in members
            ]
            continue
        if method == "allocator_replay":
            table, per_victim, warning = replays[(node, rank)]
            if table is not None:
                tables.append(table)
        else:
            timeline, events = _allocation_log(con, node, rank)
            replayed, per_victim, warning = _walk(
                timeline, events, {m.request_id: m for m in members}
            )
            rows += replayed
        if warning:
            result.warnings.append(("replay_drift", f"{node} rank {rank}: {warning}"))
        # The replay starts at the node's first pool snapshot: before it no pool size is known
        # (a missing or lost snapshot file), so a victim that took its pages earlier has no
        # page-level sources, only temporal candidates, and is told so rather than "not found".
        unreplayed = (
            _before_first_pool(node, first_pool.get(node)) if method == "allocator_replay" else None
        )
        early = 0
        for m in members:
            st = per_victim.get(m.request_id)
            if st is None and unreplayed and m.alloc_at and m.alloc_at < first_pool[node]:
                early += 1
                statuses.append(
                    AttributionStatus(
                        m.request_id, node, rank, "temporal", "candidates", 0, unreplayed
                    )
                )
                temporal_victims.append(m.request_id)
            elif st is None:
                statuses.append(
                    AttributionStatus(
                        m.request_id,
                        node,
                        rank,
                        method,
                        "none",
                        0,
                        "no allocation found in the "
                        + ("replay" if method == "allocator_replay" else "allocation log"),
                    )
                )
                temporal_victims.append(m.request_id)
            elif st.drifted:
                # The pool had drifted: page choice may be off, so tenants named only by
                # proximity in time are added as candidates for review.
                statuses.append(
                    AttributionStatus(
                        m.request_id, node, rank, method, "approximate", st.unknown_pages, warning
                    )
                )
                drifted_victims.append(m.request_id)
            elif st.unsettled:
                # Both ways were replayed (a queue run's orders, maybe victims writing or not):
                # every writer either names is listed, those of one only a step lower. No
                # candidate by time is needed.
                why = (
                    f"{UNSETTLED_NOTE} (the queue order of legs admitted together, or whether a"
                    " response judged possible was affected: the rank's warning says which);"
                    " the replay tried both ways, a source read one way only is one confidence"
                    " step lower, and each amount is the larger of the two"
                )
                if st.unknown_pages:
                    why += (
                        f"; {st.unknown_pages:,} stale pages were last written before the"
                        " replayed history begins (or never)"
                    )
                unsettled = (m.request_id, node, rank, method, "approximate", st.unknown_pages)
                statuses.append(AttributionStatus(*unsettled, why))
            else:
                note = (
                    f"{st.unknown_pages:,} stale pages were last written before the replayed"
                    " history begins (or never): their writer is not in these logs"
                    if st.unknown_pages
                    else None
                )
                status = "partial" if st.unknown_pages else "complete"
                statuses.append(
                    AttributionStatus(
                        m.request_id, node, rank, method, status, st.unknown_pages, note
                    )
                )
        if early and unreplayed:
            unreplayed_on[node] = unreplayed_on.get(node, 0) + early
    for node, early in unreplayed_on.items():
        why = _before_first_pool(node, first_pool[node])
        result.warnings.append(
            (
                "temporal_fallback",
                f"{node}: {plural(early, 'affected response')} took pages"
                f" there before its pool was known: {why}",
            )
        )
    if rows:
        tables.append(_exposure_table(rows))
    if tables:
        import pyarrow as pa

        schema = _exposure_schema()
        _insert_exposures(con, pa.concat_tables([t.cast(schema) for t in tables]))
    if temporal_victims:
        _temporal(con, temporal_victims, params, include_older=True)
    if drifted_victims:
        _temporal(con, drifted_victims, params, include_older=False)
    if statuses:
        _insert_statuses(con, statuses)
    _mark_excluded(con)
    result.methods = dict(
        con.execute(
            "SELECT method, count(*) FROM findings_exposures GROUP BY method ORDER BY method"
        ).fetchall()
    )
    drop_working_tables(con)
    return result


# Attribution's working tables. The decode timeline holds a row for every request that held
# decode pages: at 100M requests it is larger than the memory limit and sits in spill files
# that the later steps need for their own spill.
WORKING_TABLES = (
    "decode_timeline",
    "maybe_victims",
    "replay_timelines",
    "temporal_victims",
    "temporal_recent",
    "temporal_older",
    "excluded_names",
)


def drop_working_tables(con) -> None:
    """Drop attribution's working tables once the findings hold what they found."""
    for table in WORKING_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _choose_methods(
    con, ranks: list[tuple[str, int | None]]
) -> tuple[dict[tuple[str, int | None], tuple[str, str | None]], dict[str, datetime]]:
    """Per rank: allocation_log where the rank has one, else allocator_replay where the pool
    is known, else temporal (with why); and each decode node's first pool snapshot, where its
    replay begins. Two queries for all the ranks."""
    logged = {
        (node, rank)
        for node, rank in con.execute(
            "SELECT DISTINCT node, dp_rank FROM kv_allocations"
        ).fetchall()
    }
    pools, first_pool = {}, {}
    for node, dp_size, first in con.execute(
        "SELECT node, max(dp_size), min(observed_at) FROM decode_limits GROUP BY node"
    ).fetchall():
        pools[node], first_pool[node] = dp_size, first
    methods: dict[tuple[str, int | None], tuple[str, str | None]] = {}
    for node, rank in ranks:
        if (node, rank) in logged:
            methods[(node, rank)] = ("allocation_log", None)
        elif node not in pools:
            methods[(node, rank)] = (
                "temporal",
                "no pool snapshot for this decode node, so its pool cannot be replayed",
            )
        elif rank is None and (pools[node] or 1) > 1:
            methods[(node, rank)] = (
                "temporal",
                "no dp_rank recorded and the node has several ranks",
            )
        else:
            methods[(node, rank)] = ("allocator_replay", None)
    return methods, first_pool


def _before_first_pool(node: str, first: datetime | None) -> str | None:
    """Why a victim that took its pages on ``node`` before ``first``, the node's first pool
    snapshot, has no page-level sources (None when the node has no snapshot at all)."""
    if first is None:
        return None
    return (
        f"no pool snapshot of {node} before {utc(first)} (its first), so its pool cannot be"
        " replayed before then; the sources are temporal candidates only"
    )


# Keeps the rows of decode_timeline ``t`` on the ranks of parameter ``$ranks``.
_OF_RANKS = """JOIN (SELECT UNNEST($ranks, recursive := true)) g
                 ON g.node = t.node AND g.dp_rank IS NOT DISTINCT FROM t.dp_rank"""


class _RankSpan(NamedTuple):
    """Where one rank's rows sit in ``decode_timeline``: row ids ``first`` to
    ``first + rows - 1``."""

    key: tuple[str, int | None]
    first: int
    rows: int


def _replayed_spans(
    con: duckdb.DuckDBPyConnection, ranks: list[tuple[str, int | None]]
) -> list[_RankSpan]:
    """The span of rows in ``decode_timeline`` of every rank of ``ranks`` with rows that took
    pages, in table order; a rank with none is left out.

    ``timeline.sql`` writes the timeline in replay order (each rank's rows together, by
    allocation), so a rank is one range of row ids and the replay reads it without sorting
    again: at 8M requests a sorted copy of the replayed ranks' rows was the costliest statement
    of detection. A span that is not one range means the timeline was not written in that
    order: an error here, never a replay of rows out of order.
    """
    if not ranks:
        return []
    spans = con.execute(
        f"""SELECT t.node, t.dp_rank, min(t.rowid) AS first, count(*) AS n,
                   max(t.rowid) - min(t.rowid) + 1 = count(*) AS together
            FROM decode_timeline t {_OF_RANKS}
            WHERE t.alloc_at IS NOT NULL
            GROUP BY ALL ORDER BY first""",
        {"ranks": [{"node": n, "dp_rank": r} for n, r in ranks]},
    ).fetchall()
    scattered = [(node, rank) for node, rank, _, _, together in spans if not together]
    if scattered:
        raise RuntimeError(f"decode_timeline is not in replay order: rank {scattered[0]}")
    return [_RankSpan((node, rank), first, n) for node, rank, first, n, _ in spans]


# Ranks replay in chunks of about this many timeline rows (a rank larger than that alone):
# the streams of a chunk are held in memory as Arrow tables, beside DuckDB's own memory, and
# DuckDB orders a chunk's events within its memory limit. At 8M requests 2M-row chunks raised
# detection's peak from 2.1 GB to 2.5 GB; 1M-row chunks keep it under 2.3 GB.
REPLAY_CHUNK_ROWS = 1_000_000


def _rank_chunks(spans: list[_RankSpan], rows: int | None = None) -> list[list[_RankSpan]]:
    """``spans`` in order, cut into runs of at most ``rows`` timeline rows (default
    :data:`REPLAY_CHUNK_ROWS`) each; a rank with more rows than that is a run of its own.

    >>> spans = [_RankSpan(("a", 0), 0, 3), _RankSpan(("a", 1), 3, 2), _RankSpan(("b", 0), 5, 9)]
    >>> [[s.key for s in run] for run in _rank_chunks(spans, rows=5)]
    [[('a', 0), ('a', 1)], [('b', 0)]]
    """
    limit = REPLAY_CHUNK_ROWS if rows is None else rows
    chunks: list[list[_RankSpan]] = []
    held = 0
    for span in spans:
        if not chunks or held + span.rows > limit:
            chunks.append([])
            held = 0
        chunks[-1].append(span)
        held += span.rows
    return chunks


# What attribution is doing on a decode rank, by method (for progress).
_DOING = {
    "allocation_log": "reading the allocation log of",
    "allocator_replay": "replaying",
    "temporal": "temporal candidates on",
}

# How the note of an affected response whose replay's two passes differ begins (the evidence
# basis counts those apart from a replay that drifted).
UNSETTLED_NOTE = "what it read depends on what the logs do not settle"

# Signals that say a prompt may have gone over its prefill node's limit.
MAYBE_SIGNALS = "('over_pool', 'over_pool_unplaced', 'prefill_rejected', 'rejection_unresolved')"

# The timeline stream's flag of a maybe victim (``maybe_victims``), for a timeline ``s``.
MAYBE_JOIN = "LEFT JOIN maybe_victims mv ON mv.maybe_id = s.request_id"
MAYBE_COLUMN = "mv.maybe_id IS NOT NULL AS maybe_victim"

_GROUP = "node = $node AND (dp_rank = $rank OR ($rank IS NULL AND dp_rank IS NULL))"


# One decode rank's timeline as the replay reads it: its requests in allocation order.
_TIMELINE_COLUMNS = """request_id, tenant_id, prompt_tokens, completion_tokens, source_table,
                       free_at, size_known, admit_by, queue_run"""


def replay_events_sql(rank: tuple[str, ...]) -> str:
    """Every replayed rank's events, from ``replay_timelines`` (the ranks' timeline rows, each
    with its place ``idx`` in its rank's allocation order) and the decode pools' changes, each
    row carrying the columns ``rank`` of ``replay_timelines`` that name its rank: ``span`` on
    this machine, ``node, dp_rank`` on Spark (joining the rank back by node name afterwards
    cost 1.35 s against 0.80 s for six chunks of 1M rows at 16M requests). In engine order
    within a rank: ``us, kind`` and then ``rid`` or ``idx`` (a pool start, then frees, then
    allocations at one instant, the allocations in request-id order, which is their ``idx``
    order). Both schedulers of the replay read it.

    >>> print(replay_events_sql(("span",)).splitlines()[1])
    WITH ranks AS (SELECT DISTINCT span, node AS pool_node FROM replay_timelines)
    """
    of_rank = ", ".join(f"r.{column}" for column in rank)
    key = ", ".join(rank)
    return f"""
WITH ranks AS (SELECT DISTINCT {key}, node AS pool_node FROM replay_timelines)
SELECT {key}, us, rid, kind::TINYINT AS kind, coalesce(idx, 0) AS idx,
       coalesce(pool_tokens, 0) AS pool_tokens, coalesce(page_size, 1) AS page_size
FROM (
  SELECT {of_rank}, epoch_us(l.observed_at) AS us, 0 AS kind,
         NULL::VARCHAR AS rid, NULL::BIGINT AS idx, l.pool_tokens, l.page_size
  FROM decode_limits l JOIN ranks r ON r.pool_node = l.node
  UNION ALL
  SELECT {key}, epoch_us(alloc_at), 2, request_id, idx, NULL, NULL
  FROM replay_timelines
  UNION ALL
  SELECT {key}, epoch_us(free_at), 1, request_id, idx, NULL, NULL
  FROM replay_timelines WHERE free_at IS NOT NULL)"""


class _ReplayStreams:
    """The timelines and events of every rank replayed from its timeline, in two queries for
    all the ranks (node, then rank), held as Arrow tables: each rank's rows are selected once,
    never re-selected from the whole timeline, and reach the replay as NumPy arrays
    (:func:`forensics.replay.replay_rank`); only what the victims read becomes Python rows.

    Events are in engine order within a rank: at one instant a pool (re)start first, then
    frees, then allocations in request-id order. Each is ``(kind, timeline index,
    pool_tokens, page_size)``: kind 0 a pool start, 1 a free, 2 an allocation.
    """

    def __init__(self, con, spans: list[_RankSpan]):
        self._timeline: Any = None
        self._events: Any = None
        self._at: dict[tuple[str, int | None], tuple[int, int, int, int]] = {}
        if not spans:
            return
        # The chunk's ranks are consecutive in decode_timeline (_replayed_spans): one range of
        # row ids. A row's place in its rank's allocation order is its row id less its rank's
        # first, and the rank is known by that first row (``span``): the streams are ordered
        # by whole numbers only (ordering by node names and request ids cost three times as
        # much at 8M requests).
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE replay_timelines AS
               SELECT s.rowid - f.first AS idx, f.first AS span, s.node, s.dp_rank, s.alloc_at,
                      {_TIMELINE_COLUMNS}, {MAYBE_COLUMN}
               FROM decode_timeline s
               {MAYBE_JOIN}
               JOIN (SELECT UNNEST($spans, recursive := true)) f
                 ON f.node = s.node AND f.dp_rank IS NOT DISTINCT FROM s.dp_rank
               WHERE s.rowid BETWEEN $lo AND $hi AND s.alloc_at IS NOT NULL""",
            {
                "spans": [{"node": k[0], "dp_rank": k[1], "first": f} for k, f, _ in spans],
                "lo": spans[0].first,
                "hi": spans[-1].first + spans[-1].rows - 1,
            },
        )
        self._timeline = con.sql(
            f"""SELECT {_TIMELINE_COLUMNS}, maybe_victim
                FROM replay_timelines ORDER BY span, idx"""
        ).to_arrow_table()
        # Engine order within a rank (replay_events_sql). At one instant allocations follow
        # their timeline order, which is request-id order; frees at one instant release their
        # pages together whatever their order, so ``idx`` serves for both.
        self._events = con.sql(
            f"""SELECT kind, idx, pool_tokens, page_size, us
                FROM ({replay_events_sql(("span",))})
                ORDER BY span, us, kind, idx"""
        ).to_arrow_table()
        # Where each rank's rows sit in the two tables (same order as the queries).
        counts = con.execute(
            """WITH t AS (SELECT span, node, dp_rank, count(*) AS n,
                                 count(free_at) AS frees
                          FROM replay_timelines GROUP BY ALL),
                    e AS (SELECT l.node, r.dp_rank, count(*) AS n FROM decode_limits l
                          JOIN (SELECT DISTINCT node, dp_rank FROM replay_timelines) r
                            ON r.node = l.node GROUP BY ALL)
               SELECT t.node, t.dp_rank, t.n, t.n + coalesce(e.n, 0) + t.frees
               FROM t LEFT JOIN e ON e.node = t.node
                                 AND e.dp_rank IS NOT DISTINCT FROM t.dp_rank
               ORDER BY t.span"""
        ).fetchall()
        t_at = e_at = 0
        for node, rank, n_timeline, n_events in counts:
            self._at[(node, rank)] = (t_at, n_timeline, e_at, n_events)
            t_at, e_at = t_at + n_timeline, e_at + n_events

    def replay_all(
        self,
        ranks: dict[tuple[str, int | None], dict[str, Victim]],
        starting: Callable[[tuple[str, int | None]], None] | None = None,
    ) -> dict[tuple[str, int | None], tuple[Any, dict[str, VictimStatus], str | None]]:
        """Replay every rank (its victims by request id), in parallel across processes when
        the work is large (:func:`forensics.replay.replay_ranks`). ``starting`` is told of each
        rank, in order, as its replay is about to be collected. Returns, per rank, its
        exposures (an Arrow table; None when the rank has no timeline), each victim's status
        and the rank's drift warning."""
        keys = [key for key in ranks if key in self._at]
        found = replay_ranks(
            [self._arrays(key, ranks[key]) for key in keys],
            starting=(lambda i: starting(keys[i])) if starting else None,
        )
        out = {key: self._exposures(key, ranks[key], f) for key, f in zip(keys, found, strict=True)}
        return {key: out.get(key, (None, {}, None)) for key in ranks}

    def _arrays(self, key: tuple[str, int | None], victims: dict[str, Victim]) -> tuple:
        t_at, t_n, e_at, e_n = self._at[key]
        return rank_arrays(self._timeline.slice(t_at, t_n), self._events.slice(e_at, e_n), victims)

    def _exposures(
        self, key: tuple[str, int | None], victims: dict[str, Victim], found: RankReplay
    ) -> tuple[Any, dict[str, VictimStatus], str | None]:
        t_at, t_n, _, _ = self._at[key]
        return rank_exposures(self._timeline.slice(t_at, t_n), victims, found)


def rank_arrays(timeline: Any, events: Any, victims: dict[str, Victim]) -> tuple:
    """One rank's events and timeline (Arrow tables, in replay order: the timeline by
    allocation, row ``idx`` of the events naming timeline row ``idx``) as
    :func:`forensics.replay.replay_rank` takes them. Whoever schedules the replay (this
    process, its workers, a Spark task) builds them here."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def column(table, name, dtype):
        array = table.column(name).combine_chunks()
        return array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)

    is_victim = pc.is_in(timeline.column("request_id"), value_set=pa.array(list(victims)))
    return (
        column(events, "kind", np.int8),
        column(events, "idx", np.int64),
        column(events, "pool_tokens", np.int64),
        column(events, "page_size", np.int64),
        column(timeline, "prompt_tokens", np.int64),
        column(timeline, "completion_tokens", np.int64),
        pc.fill_null(timeline.column("size_known"), False)
        .combine_chunks()
        .to_numpy(zero_copy_only=False),
        pc.fill_null(is_victim, False).combine_chunks().to_numpy(zero_copy_only=False),
        # A row timed by its client record arrived then; the engine allocated it when its pool
        # had room (the replay's preallocation queue). An engine leg's time is the allocation.
        pc.equal(timeline.column("source_table"), "requests")
        .combine_chunks()
        .to_numpy(zero_copy_only=False),
        column(events, "us", np.int64),
        pc.fill_null(_epoch_us(timeline.column("admit_by")), NEVER)
        .combine_chunks()
        .to_numpy(zero_copy_only=False),
        pc.fill_null(timeline.column("queue_run").cast(pa.int64()), -1)
        .combine_chunks()
        .to_numpy(zero_copy_only=False),
        pc.fill_null(timeline.column("maybe_victim"), False)
        .combine_chunks()
        .to_numpy(zero_copy_only=False),
    )


def _epoch_us(times: Any) -> Any:
    """Timestamps as microseconds since the epoch (whatever unit they came in: pandas, as
    Spark hands them over, holds nanoseconds).

    >>> import pyarrow as pa
    >>> _epoch_us(pa.array([1_500, None], pa.timestamp("ns", tz="UTC"))).to_pylist()
    [1, None]
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    unit = pa.timestamp("us", tz=getattr(times.type, "tz", None))
    return pc.cast(pc.cast(times, unit, safe=False), pa.int64())


def rank_exposures(
    rows: Any, victims: dict[str, Victim], found: RankReplay
) -> tuple[Any, dict[str, VictimStatus], str | None]:
    """What one rank's replay found: its exposures as an Arrow table (the columns of
    :class:`Exposure`), each victim's status, and the rank's drift warning. ``rows`` is the
    rank's timeline as :func:`rank_arrays` took it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = rows.select(["request_id", "tenant_id", "source_table", "free_at"])
    states = found.victims
    statuses: dict[str, VictimStatus] = {}
    # Per victim row: its request, tenant and the confidence of what it read: of a read both
    # orders of a queue run agree on, and of one they do not (a step lower).
    recipient: dict[int, tuple[str, str | None, str, str]] = {}
    for row, drifted, unknown, unsettled in zip(
        states["row"].tolist(),
        states["drifted"].tolist(),
        states["unknown_pages"].tolist(),
        states["unsettled"].tolist(),
        strict=True,
    ):
        rid, table = rows.column("request_id")[row].as_py(), rows["source_table"][row].as_py()
        # A request with two allocations here keeps the status of its later one.
        statuses[rid] = VictimStatus(drifted=drifted, unknown_pages=unknown, unsettled=unsettled)
        confidence = _confidence("allocator_replay", table, drifted)
        recipient[row] = (rid, victims[rid].tenant_id, confidence, _lower(confidence))
    reads = found.reads
    # Each read's victim, as a position among the few victims: their values are looked
    # up once each, and every read takes them by position.
    victim_rows = np.array(sorted(recipient), dtype=np.int64)
    at = pa.array(np.searchsorted(victim_rows, reads["victim"]))
    per_victim = [recipient[v] for v in victim_rows.tolist()]

    def victim_column(i: int):
        return pa.array([v[i] for v in per_victim], pa.string()).take(at)

    sources = rows.take(pa.array(reads["writer"]))
    n = len(reads["victim"])
    table = pa.table(
        {
            "recipient_request_id": victim_column(0),
            "recipient_tenant_id": victim_column(1),
            "source_request_id": sources.column("request_id"),
            "source_tenant_id": sources.column("tenant_id"),
            "method": pa.array(["allocator_replay"] * n, pa.string()),
            "tokens": pa.array(reads["tokens"], pa.int64()),
            "confidence": pc.if_else(
                pa.array(reads["settled"], pa.bool_()), victim_column(2), victim_column(3)
            ),
            "rank": pa.nulls(n, pa.int32()),
            "source_released_at": sources.column("free_at"),
        }
    )
    return (
        table,
        statuses,
        _drift_warning(
            found.shortfalls,
            found.guesses,
            found.queue_runs,
            found.crowded,
            found.maybe,
            found.timed,
        ),
    )


def _allocation_log(con, node: str, rank) -> tuple[list[TimelineRow], list[tuple]]:
    """One rank's timeline and its allocation log's events, by their own queries. Each event
    is ``(kind, request_id, timeline index, pool_tokens, page_size, first pages, counts)``:
    kind 0 a pool start, 1 a free, 2 an allocation, in engine order as :class:`_ReplayStreams`
    orders them."""
    args = {"node": node, "rank": rank}
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE replay_rows AS
            SELECT row_number() OVER (ORDER BY alloc_at, request_id) - 1 AS idx, *
            FROM decode_timeline WHERE {_GROUP} AND alloc_at IS NOT NULL""",
        args,
    )
    timeline = [
        TimelineRow(*row)
        for row in con.execute(
            f"SELECT {_TIMELINE_COLUMNS} FROM replay_rows ORDER BY idx"
        ).fetchall()
    ]
    events = con.execute(
        """SELECT kind, rid, idx, pool_tokens, page_size, firsts, counts FROM (
             SELECT epoch_us(observed_at) AS us, 0 AS kind, NULL::VARCHAR AS rid,
                    NULL::BIGINT AS idx, pool_tokens, page_size,
                    NULL::BIGINT[] AS firsts, NULL::BIGINT[] AS counts
             FROM decode_limits WHERE node = $node
             UNION ALL
             SELECT epoch_us(k."at"), CASE k.op WHEN 'alloc' THEN 2 ELSE 1 END,
                    k.request_id, any_value(t.idx), NULL, NULL,
                    list(k.first_page ORDER BY k.first_page),
                    list(k.page_count ORDER BY k.first_page)
             FROM kv_allocations k LEFT JOIN replay_rows t USING (request_id)
             WHERE k.node = $node
               AND (k.dp_rank = $rank OR ($rank IS NULL AND k.dp_rank IS NULL))
             GROUP BY k."at", k.op, k.request_id)
           ORDER BY us, kind, rid NULLS FIRST""",
        args,
    ).fetchall()
    return timeline, events


def _walk(
    timeline: list[TimelineRow],
    events: list[tuple],
    victims: dict[str, Victim],
) -> tuple[list[Exposure], dict[str, VictimStatus], str | None]:
    """Walk a rank's allocation log: who wrote each page and what each victim read. The pages
    of every allocation are logged, so nothing is replayed and nothing can drift."""
    import numpy as np

    method = "allocation_log"
    statuses: dict[str, VictimStatus] = {}
    pool: PagePool | None = None
    page_size = 1
    exposures: list[Exposure] = []
    for kind, rid, i, pool_tokens, new_page_size, firsts, counts in events:
        if kind == 0:
            page_size = new_page_size
            pool = PagePool(pool_tokens // page_size)
            continue
        if pool is None:
            continue  # activity before any snapshot of the pool: nothing to replay against
        if kind == 1:
            pool.free(rid)
            continue
        pages = pool.take(
            rid,
            np.concatenate(
                [np.arange(f, f + c, dtype=np.int64) for f, c in zip(firsts, counts, strict=True)]
            ),
        )
        if i is None:
            continue  # an allocation with no request record: its pages keep their writers
        if rid in victims:
            row = timeline[i]
            statuses[rid] = VictimStatus(
                unknown_pages=unknown_stale_pages(pool, pages, row.prompt_tokens, page_size),
            )
            confidence = _confidence(method, row.source_table)
            read = stale_read(pool, pages, i, row.prompt_tokens, row.completion_tokens, page_size)
            for writer, n in read.items():
                src = timeline[writer]
                exposures.append(
                    Exposure(
                        rid,
                        victims[rid].tenant_id,
                        src.request_id,
                        src.tenant_id,
                        method,
                        n * page_size,
                        confidence,
                        None,
                        src.free_at,
                    )
                )
        else:
            pool.writer[pages] = i
    exposures.sort(key=lambda e: (e.recipient_request_id, -e.tokens, e.source_request_id))
    return exposures, statuses, None


def _sized_by_time(guesses: int, timed: int) -> str:
    """How the uncounted legs of a rank were sized, said after the warning about them.

    >>> _sized_by_time(3, 0)
    ''
    >>> _sized_by_time(3, 2)
    ' (2 sized by how long each held its pages, 1 by its prompt alone)'
    """
    if not timed:
        return ""
    if timed >= guesses:
        return " (each sized by how long it held its pages)"
    return (
        f" ({timed:,} sized by how long each held its pages,"
        f" {guesses - timed:,} by its prompt alone)"
    )


def _drift_warning(
    shortfalls: int,
    guesses: int,
    queue_runs: int = 0,
    crowded: int = 0,
    maybe: int = 0,
    timed: int = 0,
) -> str | None:
    """Why a replayed rank's sources are approximate, if they are.

    >>> _drift_warning(0, 0) is None
    True
    >>> print(_drift_warning(1, 0))
    1 allocation did not fit the replayed pool when the logs place it (timed by its arrival,
    not before its first token); the logs are incomplete or the pool was not empty when they
    begin, so sources are approximate
    >>> _drift_warning(0, 3).split(",")[0]
    '3 decode legs have no client record and no count of generated tokens'
    >>> print(_drift_warning(0, 3, timed=3))
    3 decode legs have no client record and no count of generated tokens, so the replayed pool is
    approximate (each sized by how long it held its pages)
    >>> print(_drift_warning(0, 0, 2))
    2 groups of decode legs admitted together entered the queue within 100 microseconds of one
    another: the logs do not settle their order, so the replay tried both: a source read in one
    order only is one confidence step lower, and an amount the larger of the two orders'
    >>> print(_drift_warning(0, 0, 0, 0, 2))
    2 responses judged possible (a prompt that may have gone over its prefill limit, not
    confirmed) took pages here, and what a response read depends on whether they were affected
    (then they left older KV in their prompt's pages): the replay tried both, and a source read
    one way only is one confidence step lower
    >>> print(_drift_warning(0, 0, 1, 3).split("; ")[1])
    3 decode legs were admitted together with two or more others whose queue entries lie within
    100 microseconds of theirs: too many orders to try, so a response among them has approximate
    sources, and one reading their pages has them one confidence step lower
    """
    from forensics.terminal import plural

    parts = []
    if guesses:
        # With neither the client record nor the engine's count of a leg's generated tokens,
        # its allocation size is a guess and every later allocation on the rank may be shifted.
        parts.append(
            f"{plural(guesses, 'decode leg has', 'decode legs have')} no client record and no"
            " count of generated tokens, so the replayed pool is approximate"
            + _sized_by_time(guesses, timed)
        )
    if shortfalls:
        parts.append(
            # Timed by its arrival, an allocation may wait for room, but not past its first
            # token (nor its release).
            f"{plural(shortfalls, 'allocation')} did not fit the replayed pool when the logs"
            " place it (timed by its arrival, not before its first token); the logs are"
            " incomplete or the pool was not empty when they begin, so sources are approximate"
        )
    if queue_runs:
        parts.append(
            f"{plural(queue_runs, 'group')} of decode legs admitted together entered the queue"
            " within 100 microseconds of one another: the logs do not settle their order, so"
            " the replay tried both: a source read in one order only is one confidence step"
            " lower, and an amount the larger of the two orders'"
        )
    if crowded:
        parts.append(
            f"{plural(crowded, 'decode leg was', 'decode legs were')} admitted together with two"
            " or more others whose queue entries lie within 100 microseconds of theirs: too"
            " many orders to try, so a response among them has approximate sources, and one"
            " reading their pages has them one confidence step lower"
        )
    if maybe:
        parts.append(
            f"{plural(maybe, 'response')} judged possible (a prompt that may have gone over its"
            " prefill limit, not confirmed) took pages here, and what a response read depends"
            " on whether they were affected (then they left older KV in their prompt's pages):"
            " the replay tried both, and a source read one way only is one confidence step"
            " lower"
        )
    return "; ".join(parts) or None


def unknown_stale_pages(pool: PagePool, pages: np.ndarray, prompt_tokens: int, page_size: int):
    """How many of a victim's stale pages have no known writer (call before ``stale_read``).

    >>> pool = PagePool(pages=4)
    >>> pool.writer[2] = 7
    >>> unknown_stale_pages(pool, pool.alloc("v", 4), 16, 4)  # pages 2-4 stale, 2 unwritten
    2
    """
    stale = pages[1 : _ceil_div(max(prompt_tokens, 1), page_size)]
    return int((pool.writer[stale] < 0).sum())


def _exposure_schema():
    """The Arrow columns of :class:`Exposure`, whoever made the rows."""
    import pyarrow as pa

    types = [pa.string()] * 5 + [pa.int64(), pa.string(), pa.int32(), pa.timestamp("us", "UTC")]
    return pa.schema(list(zip(Exposure._fields, types, strict=True)))


def _exposure_table(rows: list[Exposure]):
    """Exposures as an Arrow table, one column per field."""
    import pyarrow as pa

    columns = {n: [r[i] for r in rows] for i, n in enumerate(Exposure._fields)}
    return pa.table(columns, schema=_exposure_schema())


def _insert_exposures(con, exposure_rows) -> None:
    """Insert an Arrow table of exposures in bulk (row-by-row inserts cost seconds per
    thousand rows)."""
    con.register("exposure_rows", exposure_rows)
    con.execute(
        """INSERT INTO findings_exposures
           SELECT recipient_request_id, recipient_tenant_id, source_request_id,
                  source_tenant_id, method, tokens, confidence, rank::INTEGER,
                  source_released_at::TIMESTAMPTZ, NULL, NULL
           FROM exposure_rows"""
    )
    con.unregister("exposure_rows")


def _lower(confidence: str) -> str:
    """One confidence step lower (the lowest stays).

    >>> _lower("high"), _lower("very_low")
    ('medium', 'very_low')
    """
    at = CONFIDENCE_ORDER.index(confidence)
    return CONFIDENCE_ORDER[min(at + 1, len(CONFIDENCE_ORDER) - 1)]


def _confidence(method: str, source_table: str, drifted: bool = False) -> str:
    """Confidence of a page-level exposure; a drifted replay drops one step.

    >>> _confidence("allocator_replay", "engine_legs"), _confidence("allocator_replay",
    ...     "requests", drifted=True)
    ('high', 'low')
    """
    if method == "allocation_log":
        return "exact"
    base = "high" if source_table == "engine_legs" else "medium"
    return _lower(base) if drifted else base


def _insert_statuses(con, rows: list[AttributionStatus]) -> None:
    import pyarrow as pa

    names = AttributionStatus._fields
    status_rows = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})
    con.register("status_rows", status_rows)
    con.execute(
        """INSERT INTO findings_attribution
           SELECT recipient_request_id, node, dp_rank::BIGINT, method, status,
                  unknown_pages::BIGINT, note FROM status_rows"""
    )
    con.unregister("status_rows")


def _temporal(con, victims: list[str], params: dict[str, Any], *, include_older: bool) -> None:
    """Rank the requests whose KV may have been left in the pages a victim read.

    Without the pool, the allocator cannot be replayed and a stale page may have been written
    at any time since the node started (the lowest pages are reused constantly, higher ones may
    sit untouched for days). So the candidates are two tiers, both from the victim's node (and
    rank when known) and released before it took its pages:

    - every request released within the overlap window, newest first (confidence ``low``);
    - beyond the window, each other tenant's latest release, newest first (``very_low``), so
      no tenant that could have been read is left out (source-tenant recall stays whole).
      Only where no replay exists (``include_older``): a drifted replay still named most
      writers, so its plausible misses are the recent releases.
    """
    from forensics.sql import run_sql_file

    run_sql_file(
        con,
        "temporal.sql",
        {
            "victims": victims,
            "window_s": params["overlap_window_s"],
            "include_older": include_older,
        },
    )


def _mark_excluded(con) -> None:
    """Carry exclusion marks onto both ends of every exposure."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE excluded_names AS
           SELECT request_id, string_agg(exclusion, ',' ORDER BY exclusion) AS names
           FROM findings_excluded GROUP BY request_id"""
    )
    # Rewritten whole rather than updated in place: DuckDB's UPDATE ... FROM took seconds for
    # a few thousand matches among a hundred thousand exposures (4.2 s of a 2M detection).
    con.execute(
        """CREATE OR REPLACE TEMP TABLE marked_exposures AS
           SELECT x.* REPLACE (r.names AS recipient_excluded_by, s.names AS source_excluded_by)
           FROM (SELECT *, row_number() OVER () AS __order FROM findings_exposures) x
           LEFT JOIN excluded_names r ON r.request_id = x.recipient_request_id
           LEFT JOIN excluded_names s ON s.request_id = x.source_request_id
           ORDER BY x.__order"""
    )
    con.execute("DELETE FROM findings_exposures")
    con.execute("INSERT INTO findings_exposures SELECT * EXCLUDE (__order) FROM marked_exposures")
    con.execute("DROP TABLE marked_exposures")
