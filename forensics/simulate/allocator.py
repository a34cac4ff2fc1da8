"""The decode KV page allocator of one (decode node, dp rank), with page writers tracked.

This is SGLang's paged allocator in PD mode (``need_sort``), as docs/architecture.md (section 5)
describes it:

- pages ``1..P`` (page 0 is reserved); ``free_pages`` starts ascending, ``release_pages`` empty;
- ``alloc(tokens)``: ``n = ceil(tokens / page_size)``; if ``n > len(free_pages)`` the freed pages
  are merged in and the list sorted ascending; if still short, the request waits in the
  preallocation queue until enough pages are freed (and the scheduler's next pass after that
  free); it takes ``free_pages[:n]``;
- ``free(pages)``: the pages are parked in ``release_pages`` until the next merge.

Because the merged list is always sorted, the order in which parked pages were released never
matters, so they are kept as a list of arrays and only concatenated at a merge.

Writers, not owners: each page remembers the last request that wrote KV into it. A normal
request writes every page it holds; an exposed request (victim) writes only page 0 (the one page
prefill shipped) and the pages holding its generated tokens, so the rest of its reservation
keeps the earlier writer's KV and can leak that same writer again to a later victim.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# From a free to the allocation of a request that was waiting for those pages: one pass of the
# decode scheduler's loop.
ADMIT_AFTER_FREE_US = 1_000


@dataclass
class RankResult:
    """What one rank's replay produced (indices are global request indices)."""

    start_us: np.ndarray  # actual allocation instant per request (input order)
    exposures: list[tuple[int, int, int]] = field(default_factory=list)  # victim, source, pages
    stale_unwritten: list[tuple[int, int]] = field(default_factory=list)  # victim, pages
    # Contiguous page runs of every allocation, when asked for (three aligned lists).
    run_request: list[int] = field(default_factory=list)
    run_first: list[int] = field(default_factory=list)
    run_count: list[int] = field(default_factory=list)


def page_runs(pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split a page list into contiguous ascending runs: (first pages, run lengths).

    >>> import numpy as np
    >>> [a.tolist() for a in page_runs(np.array([3, 4, 5, 9, 10, 2]))]
    [[3, 9, 2], [3, 2, 1]]
    """
    import numpy as np

    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(pages)]])
    return pages[starts], ends - starts


def run_rank(
    index: np.ndarray,
    desired_us: np.ndarray,
    hold_us: np.ndarray,
    prompt: np.ndarray,
    total_tokens: np.ndarray,
    victim: np.ndarray,
    pool_tokens: int,
    page_size: int,
    record_runs: bool = False,
) -> RankResult:
    """Replay one rank: allocate, record stale reads of victims, free.

    Args:
        index: global request indices, already ordered by (wanted instant, request_id).
        desired_us: when each request asks decode to preallocate.
        hold_us: how long it holds its pages once allocated (allocation to free).
        prompt: prompt tokens (the reservation a victim reads over).
        total_tokens: prompt + completion tokens: the allocation size.
        victim: whether the request is an exposed one (its prompt KV never arrived).
        pool_tokens: the rank's pool; ``pool_tokens // page_size`` pages are usable.
        record_runs: also keep every allocation's contiguous page runs (kv_allocations).

    Returns:
        Actual allocation instants, exposures and (optionally) page runs. Allocation instants
        on a rank are strictly increasing, so replaying the written timestamps in the order
        (time, frees before allocs, request_id) reproduces this run exactly.
    """
    import numpy as np

    n_pages = pool_tokens // page_size
    free = np.arange(1, n_pages + 1, dtype=np.int64)
    head = 0
    released: list[np.ndarray] = []
    writer = np.full(n_pages + 1, -1, dtype=np.int64)
    pending: list[tuple[int, int, np.ndarray]] = []  # (free instant, request, pages) heap
    result = RankResult(np.empty(0, dtype=np.int64))
    prev = -1
    # Plain Python ints in the loop: indexing numpy scalars one at a time is several times
    # slower than indexing lists.
    need_pages = (-(-total_tokens // page_size)).tolist()
    wanted, holds, prompts = desired_us.tolist(), hold_us.tolist(), prompt.tolist()
    victims, ids = victim.tolist(), index.tolist()
    starts: list[int] = []
    for j in range(len(ids)):
        # Strictly after the previous allocation on this rank: ties (and requests that queued
        # behind a waiting one) would otherwise depend on tie-breaking rules.
        t = wanted[j] if wanted[j] > prev else prev + 1
        while pending and pending[0][0] <= t:
            released.append(heapq.heappop(pending)[2])
        n = need_pages[j]
        if n > len(free) - head:
            free = np.sort(np.concatenate([free[head:], *released]))
            head, released = 0, []
            while n > len(free):
                # Pool exhausted: wait in the preallocation queue for the next free. The
                # scheduler frees a finished request's pages after its batch and serves the
                # queue on its next pass, so the allocation comes a little after the free.
                t = max(t, pending[0][0] + ADMIT_AFTER_FREE_US)
                while pending and pending[0][0] <= t:
                    released.append(heapq.heappop(pending)[2])
                free = np.sort(np.concatenate([free, *released]))
                released = []
        pages = free[head : head + n]
        head += n
        g = ids[j]
        if victims[j]:
            stale_n = -(-prompts[j] // page_size)  # pages of the reserved prompt
            w = writer[pages[1:stale_n]]
            known = w[w >= 0]
            if known.size:
                src, cnt = np.unique(known, return_counts=True)
                result.exposures += [
                    (g, s, c) for s, c in zip(src.tolist(), cnt.tolist(), strict=True)
                ]
            if known.size < w.size:
                result.stale_unwritten.append((g, int(w.size - known.size)))
            writer[pages[0]] = g
            writer[pages[prompts[j] // page_size :]] = g
        else:
            writer[pages] = g
        if record_runs:
            first = int(pages[0])
            if int(pages[-1]) - first == n - 1:  # the common case: one contiguous run
                result.run_request.append(g)
                result.run_first.append(first)
                result.run_count.append(n)
            else:
                firsts, counts = page_runs(pages)
                result.run_request += [g] * len(firsts)
                result.run_first += firsts.tolist()
                result.run_count += counts.tolist()
        starts.append(t)
        prev = t
        heapq.heappush(pending, (t + holds[j], g, pages))
    result.start_us = np.array(starts, dtype=np.int64)
    return result
