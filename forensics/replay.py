"""The allocator replay of one decode rank, over arrays: events in, who each victim read out.

The rule replayed is SGLang's PD allocator as :class:`forensics.attribution.PagePool` states
it one step at a time: pages 1..P, an ascending free list consumed from its head, freed pages
parked until an allocation finds the free list too short, then merged and sorted. This module
walks the same rule a stretch at a time, so the work per rank is a few array operations per
*merge* of the free list, not Python per event:

- Between two merges the free list does not change, so the allocations in between take
  consecutive slices of it: their positions are a cumulative sum, and the stretch ends at the
  first allocation the rest of the list cannot hold (a binary search).
- Pages taken in one stretch are all different, so no allocation of a stretch overwrites
  another's pages: each victim of the stretch reads the writers left by earlier stretches,
  and the stretch's writes are applied afterwards, all at once.
- A merge gathers the pages of every allocation freed since the previous merge (freed after
  it was made, in event order) and sorts them in with what is left of the list.
- An allocation timed by its arrival (a client record's time) that the merged list cannot hold
  waits, as in the engine's preallocation queue: the first later free that makes room is found
  by a cumulative sum of what each free gives back, and the allocations that arrived before
  that free are taken after it, in order.
- Allocations of one admission whose order in the queue the logs do not settle (a *queue
  run*: their entries lie within the rounding of the logged durations) are replayed in both
  orders, the run's allocations reversed the second time. A writer a victim read in both
  orders is settled (its amount the larger of the two); one it read in one order only is not.
  Two orders are all the orders of a run of two; a run of three or more has orders neither
  tries, so a page one of its members wrote is never settled, and a victim in one counts as
  drifted.

Nothing here knows DuckDB: a rank is a handful of NumPy arrays, so any scheduler (threads
here, one task per rank elsewhere) can run :func:`replay_rank` as it is. Allocations and
frees are keyed by timeline row: each row of a rank's timeline is one allocation, freed at
most once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

# Event kinds, in the order they sort at one instant: a pool (re)start, frees, allocations.
POOL_START, FREE, ALLOC = 0, 1, 2
# The admission instant of an allocation no release made room for.
NEVER = 2**63 - 1


@dataclass
class RankReplay:
    """What replaying one rank found.

    Attributes:
        reads: one row per (victim, writer): the victim's timeline row, the writer's, how
            many tokens of the victim's stale pages the writer's KV filled (the more of the
            two orders of a queue run), and whether that read is ``settled``: made in both
            orders, its writer in no queue run of three or more.
        victims: one row per victim allocation replayed (in event order): its timeline row,
            whether the replay had drifted by then (an earlier allocation of its pool did not
            fit or had a guessed size, or its own did not fit, or it is in a queue run of three
            or more), its stale pages whose writer is not in the replayed history, and whether
            what it read is ``unsettled``: it differs in any way between the two orders of a
            queue run, or some of it was written by a member of a run of three or more.
        shortfalls: allocations the replayed pool could not hold in full.
        guesses: allocations sized without knowing their generated tokens.
        timed: of those, the ones sized by how long they held their pages
            (:func:`guess_generated`); the rest by their prompt alone.
        queue_runs: queue runs replayed in their other order too.
        crowded: allocations in queue runs of three or more, whose other orders are not tried.
        maybe: maybe victims on the rank (see :func:`replay_rank`) where they changed what
            some victim read; 0 otherwise.
    """

    reads: dict[str, np.ndarray]
    victims: dict[str, np.ndarray]
    shortfalls: int = 0
    guesses: int = 0
    queue_runs: int = 0
    crowded: int = 0
    maybe: int = 0
    timed: int = 0


_READS = {"victim": "int64", "writer": "int64", "tokens": "int64", "settled": "bool"}
_VICTIMS = {"row": "int64", "drifted": "bool", "unknown_pages": "int64", "unsettled": "bool"}


def replay_rank(
    kind: np.ndarray,
    row: np.ndarray,
    pool_tokens: np.ndarray,
    page_size: np.ndarray,
    prompt_tokens: np.ndarray,
    completion_tokens: np.ndarray,
    size_known: np.ndarray,
    victim: np.ndarray,
    may_wait: np.ndarray | None = None,
    at: np.ndarray | None = None,
    admit_by: np.ndarray | None = None,
    queue_run: np.ndarray | None = None,
    maybe_victim: np.ndarray | None = None,
) -> RankReplay:
    """Replay one rank's events through its page pool.

    Args:
        kind: per event, ``POOL_START``, ``FREE`` or ``ALLOC``, in engine order.
        row: per event, the timeline row freed or allocated (ignored for a pool start).
        pool_tokens, page_size: per event, the pool a ``POOL_START`` sets (else ignored).
        prompt_tokens, completion_tokens, size_known, victim: per timeline row.
        may_wait: per timeline row, whether its allocation's time is its arrival (a client
            record's), so that a pool too full to hold it makes it wait (the preallocation
            queue, first in, first out) rather than disagree with the logs. None: no row waits.
        at, admit_by: per event its instant, and per row the latest instant its allocation
            agrees with the logs (its first token); an allocation that waited past it counts
            as a shortfall. None: not checked.
        queue_run: per timeline row, the queue run it belongs to (rows of one admission whose
            order in the queue the logs do not settle), or -1. None: no row does.
        maybe_victim: per timeline row, whether it may have been a victim that was not judged
            one (its prompt perhaps over its prefill limit): the replay's other pass has it
            write only what a victim writes (its first page and its answer), so the older
            writers of the rest of its pages are named too. None: no row.

    Events before the first pool start have no pool to replay against and are skipped.

    >>> import numpy as np
    >>> kinds = np.array([POOL_START, ALLOC, FREE, ALLOC])
    >>> out = replay_rank(kinds, np.array([0, 0, 0, 1]), np.array([8, 0, 0, 0]),
    ...                   np.array([1, 0, 0, 0]), prompt_tokens=np.array([5, 6]),
    ...                   completion_tokens=np.array([1, 1]),
    ...                   size_known=np.array([True, True]), victim=np.array([False, True]))
    >>> {k: v.tolist() for k, v in out.reads.items()}
    {'victim': [1], 'writer': [0], 'tokens': [5], 'settled': [True]}
    """
    import numpy as np

    kind, row = np.asarray(kind), np.asarray(row)
    rows = _Rows(prompt_tokens, completion_tokens, size_known, victim, may_wait, admit_by)
    if queue_run is not None:
        rows.crowded = _in_crowded_run(np.asarray(queue_run, dtype=np.int64))
    instants = np.zeros(len(kind), dtype=np.int64) if at is None else np.asarray(at, np.int64)
    timed = 0
    if at is not None:
        guessed = guess_generated(
            kind, row, instants, rows.prompt, rows.completion, rows.size_known, rows.may_wait
        )
        # A guess is at least one token, where an uncounted row held none.
        timed = int(np.count_nonzero(guessed != rows.completion))
        rows.completion = guessed
    found = _replay_in_order(kind, row, pool_tokens, page_size, rows, instants)
    other, runs = row, 0
    if queue_run is not None:
        other, runs = _other_order(kind, row, np.asarray(queue_run, dtype=np.int64))
    maybe, alt_rows = 0, rows
    if maybe_victim is not None:
        flag = np.asarray(maybe_victim, dtype=np.bool_) & ~rows.victim
        maybe = int(flag.sum())
        if maybe:
            alt_rows = copy.copy(rows)
            alt_rows.stale = rows.victim | flag
    if runs or maybe:
        alt = _replay_in_order(kind, other, pool_tokens, page_size, alt_rows, instants)
        found = _settle(found, alt, len(rows.prompt), runs)
        # Said only where the maybe victims changed what some victim read.
        found.maybe = maybe if found.victims["unsettled"].any() else 0
    found.timed = timed
    return found


def _replay_in_order(kind, row, pool_tokens, page_size, rows: _Rows, instants) -> RankReplay:
    """Replay the events in the order given, pool start by pool start."""
    import numpy as np

    starts = np.flatnonzero(kind == POOL_START)
    found: list[dict[str, np.ndarray]] = []
    states: list[dict[str, np.ndarray]] = []
    shortfalls = guesses = crowded = 0
    for s, begin in enumerate(starts):
        end = starts[s + 1] if s + 1 < len(starts) else len(kind)
        size = int(page_size[begin]) or 1
        segment = _Segment(
            int(pool_tokens[begin]) // size,
            size,
            kind[begin + 1 : end],
            row[begin + 1 : end],
            instants[begin + 1 : end],
        )
        reads, state = segment.replay(rows)
        found.append(reads)
        states.append(state)
        shortfalls += segment.shortfalls
        guesses += segment.guesses
        crowded += segment.crowded
    return RankReplay(
        reads=_concat(found, _READS),
        victims=_concat(states, _VICTIMS),
        shortfalls=shortfalls,
        guesses=guesses,
        crowded=crowded,
    )


# Decode legs of the rank with a known count of generated tokens needed to fit its decode
# speed; with fewer, a leg of unknown count is sized by its prompt alone, as before.
MIN_FIT_ROWS = 20
# Rounds of the fit, each leaving out the legs far off the one before.
FIT_ROUNDS = 4
# A fitted step shorter than this (µs) is noise, not a decode step: no engine generates a token
# in a tenth of a millisecond, so such a rank's times say nothing of its tokens.
MIN_STEP_US = 100.0


def guess_generated(
    kind: np.ndarray,
    row: np.ndarray,
    instants: np.ndarray,
    prompt: np.ndarray,
    completion: np.ndarray,
    size_known: np.ndarray,
    may_wait: np.ndarray,
) -> np.ndarray:
    """Generated tokens per timeline row (``completion`` where the logs count them), guessed
    where they do not.

    A decode leg with no client record and no count of its own (SGLang counts; canonical and
    OTLP legs may not) grew its allocation by the tokens it generated, and every later
    allocation of the rank took its pages after those. Counted as none, each such leg leaves
    the replayed free list a few pages short, and the shortfall adds up over the rank's
    history. How long a decode leg held its pages grows with its prompt (the transfer) and its
    generated tokens (one step each): fitted by least squares on this rank's own legs whose
    count is known (leaving out those that stalled), the time a leg of unknown count held its
    pages gives its tokens, at least one and at most the most any known leg generated. The
    guess stays a guess: such rows are still ``size_known`` false, so what a victim read after
    them stays approximate. Rows timed by a client record (``may_wait``) and rows never freed
    keep what they had. The arguments are :func:`replay_rank`'s, events then rows.

    >>> import numpy as np
    >>> n = 40
    >>> prompt = np.arange(n) * 100 + 500
    >>> made = np.arange(n) % 7 * 30 + 10
    >>> held = 2_000 + prompt * 3 + made * 20_000        # µs: transfer, then one step a token
    >>> known = np.arange(n) != 5
    >>> kind = np.array([ALLOC] * n + [FREE] * n)
    >>> row = np.concatenate([np.arange(n), np.arange(n)])
    >>> instants = np.concatenate([np.arange(n) * 10, np.arange(n) * 10 + held])
    >>> out = guess_generated(kind, row, instants, prompt, np.where(known, made, 0), known,
    ...                       np.zeros(n, bool))
    >>> int(out[5]), int(made[5])
    (160, 160)
    """
    import numpy as np

    prompt, completion = np.asarray(prompt, np.int64), np.asarray(completion, np.int64)
    size_known, may_wait = np.asarray(size_known, np.bool_), np.asarray(may_wait, np.bool_)
    guess = ~size_known & ~may_wait
    if not guess.any():
        return completion
    n = len(prompt)
    alloc, free = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    took, gave = kind == ALLOC, kind == FREE
    alloc[row[took]] = instants[took]
    free[row[gave]] = instants[gave]
    held = (alloc >= 0) & (free > alloc)
    known = size_known & ~may_wait & held & (completion > 0)
    if int(known.sum()) < MIN_FIT_ROWS or not (guess & held).any():
        return completion
    duration = (free - alloc).astype(np.float64)
    fit = np.column_stack([np.ones(n), prompt.astype(np.float64), completion.astype(np.float64)])
    # A leg that stalled (a client gone, a wait logged inside its time) held its pages far
    # longer than its tokens took, and a few such legs are enough to tip a least-squares fit.
    # The first fit leaves out the legs held far longer than the rank's usual (beyond ten
    # robust deviations of the median); each next one the legs far off the fit before it
    # (beyond three robust deviations of its residuals).
    middle = np.median(duration[known])
    use = known & (duration <= middle + 10 * _spread(duration[known]))
    if int(use.sum()) < MIN_FIT_ROWS:
        use = known.copy()
    for _ in range(FIT_ROUNDS):
        coef, *_ = np.linalg.lstsq(fit[use], duration[use], rcond=None)
        residual = duration - fit @ coef
        keep = known & (np.abs(residual) <= 3 * _spread(residual[use]))
        if int(keep.sum()) < MIN_FIT_ROWS or (keep == use).all():
            break
        use = keep
    base, per_prompt, per_token = coef
    if not per_token >= MIN_STEP_US:
        return completion
    tokens = np.rint((duration - base - per_prompt * prompt) / per_token)
    tokens = np.clip(np.nan_to_num(tokens, nan=1.0), 1, int(completion[known].max()))
    out = completion.copy()
    sized = guess & held
    out[sized] = tokens[sized].astype(np.int64)
    return out


def _spread(values: np.ndarray) -> float:
    """A deviation of ``values`` that a few far-off ones do not move (the median absolute
    deviation, scaled to a normal spread), at least one microsecond.

    >>> import numpy as np
    >>> _spread(np.array([10.0, 11.0, 12.0, 1e9]))
    1.4826
    """
    import numpy as np

    return max(1.4826 * float(np.median(np.abs(values - np.median(values)))), 1.0)


def _in_crowded_run(queue_run: np.ndarray) -> np.ndarray:
    """Per timeline row, whether it is in a queue run of three or more rows.

    >>> import numpy as np
    >>> _in_crowded_run(np.array([-1, 4, 4, 9, 9, 9, -1])).tolist()
    [False, False, False, True, True, True, False]
    """
    import numpy as np

    runs, members = np.unique(queue_run[queue_run >= 0], return_counts=True)
    return np.isin(queue_run, runs[members >= 3])


def _other_order(kind: np.ndarray, row: np.ndarray, queue_run: np.ndarray) -> tuple:
    """The events' rows with each queue run's allocations reversed (the events themselves,
    and so every instant, stay where they are), and how many runs there are.

    >>> import numpy as np
    >>> kinds = np.array([POOL_START, ALLOC, ALLOC, ALLOC, FREE, ALLOC, ALLOC])
    >>> rows = np.array([0, 0, 1, 2, 0, 3, 4])
    >>> other, runs = _other_order(kinds, rows, np.array([-1, 7, 7, -1, 7]))
    >>> other.tolist(), runs
    ([0, 0, 4, 2, 0, 3, 1], 1)
    """
    import numpy as np

    alloc = np.flatnonzero(kind == ALLOC)
    run = queue_run[row[alloc]]
    alloc, run = alloc[run >= 0], run[run >= 0]
    if not len(alloc):
        return row, 0
    order = np.argsort(run, kind="stable")  # each run's allocations together, in event order
    alloc, run = alloc[order], run[order]
    first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    lengths = np.diff(np.r_[first, len(run)])
    start = np.repeat(first, lengths)
    mirror = 2 * start + np.repeat(lengths, lengths) - 1 - np.arange(len(run))
    other = row.copy()
    other[alloc] = row[alloc[mirror]]
    # A run with one allocation here (the others took no pages on this rank) has no other order.
    return other, int((lengths > 1).sum())


def _settle(base: RankReplay, alt: RankReplay, n_rows: int, runs: int) -> RankReplay:
    """One replay of both orders of the queue runs: every (victim, writer) read in either,
    with the larger amount, settled when both orders made it; a victim is unsettled when
    anything it read differs between them (a writer, an amount, its pages of no known
    writer)."""
    import numpy as np

    def keyed(reads):
        return reads["victim"] * (n_rows + 1) + reads["writer"], reads["tokens"]

    (kb, tb), (ka, ta) = keyed(base.reads), keyed(alt.reads)
    keys = np.union1d(kb, ka)
    tokens_b, tokens_a = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.int64)
    tokens_b[np.searchsorted(keys, kb)] = tb
    tokens_a[np.searchsorted(keys, ka)] = ta
    # Settled: made in both orders, and settled in each (a writer in a queue run of three or
    # more never is).
    sure = np.ones(len(keys), np.bool_)
    sure[np.searchsorted(keys, kb)] &= base.reads["settled"]
    sure[np.searchsorted(keys, ka)] &= alt.reads["settled"]
    settled = (tokens_b > 0) & (tokens_a > 0) & sure
    reads = {
        "victim": keys // (n_rows + 1),
        "writer": keys % (n_rows + 1),
        "tokens": np.maximum(tokens_b, tokens_a),
        "settled": settled,
    }
    # The same allocations are victims in both orders: line them up by timeline row.
    vb, va = base.victims, alt.victims
    ob, oa = np.argsort(vb["row"], kind="stable"), np.argsort(va["row"], kind="stable")
    if not np.array_equal(vb["row"][ob], va["row"][oa]):
        # Not expected (the same allocations, in other places): if it happens, the logged
        # order's replay stands, with every victim's sources approximate.
        victims = {**vb, "drifted": np.ones(len(vb["row"]), np.bool_)}
        return RankReplay(base.reads, victims, base.shortfalls, base.guesses, runs, base.crowded)
    unknown_b, unknown_a = vb["unknown_pages"][ob], va["unknown_pages"][oa]
    victims = {
        "row": vb["row"][ob],
        "drifted": vb["drifted"][ob] | va["drifted"][oa],
        "unknown_pages": np.maximum(unknown_b, unknown_a),
        "unsettled": np.isin(vb["row"][ob], reads["victim"][(tokens_b != tokens_a) | ~sure])
        | (unknown_b != unknown_a),
    }
    return RankReplay(
        reads=reads,
        victims=victims,
        shortfalls=max(base.shortfalls, alt.shortfalls),
        guesses=base.guesses,
        queue_runs=runs,
        crowded=base.crowded,
    )


# Below this many events in all, ranks are replayed in this process: starting worker
# processes costs about a third of a second, as much as replaying a million events.
PARALLEL_EVENTS = 1_000_000


def replay_ranks(
    ranks: list[tuple],
    workers: int | None = None,
    starting: Callable[[int], None] | None = None,
) -> list[RankReplay]:
    """Replay many ranks (each the arguments of :func:`replay_rank`), in parallel across
    processes when there is enough work to pay for starting them.

    Ranks are independent, so they are dealt into ``workers`` shares of about equal events
    (default: one per CPU); this process replays one share while fresh interpreters replay
    the others (:func:`serve`). Threads would not help: the walk holds the interpreter's lock
    between array operations. The workers are new processes running only this module, not
    forks: the caller holds a database connection with threads of its own, and its main
    script is not run again. A worker that fails has its share replayed here instead.
    Results come back in ``ranks`` order; ``starting`` is told each rank's position as its
    result is collected (progress).
    """
    import os

    tell = starting or (lambda i: None)
    workers = workers if workers is not None else os.cpu_count() or 1
    events = sum(len(r[0]) for r in ranks)
    if workers < 2 or len(ranks) < 2 or events < PARALLEL_EVENTS:
        out = []
        for i, rank in enumerate(ranks):
            tell(i)
            out.append(replay_rank(*rank))
        return out
    shares = _deal(ranks, min(workers, len(ranks)))
    found: dict[int, RankReplay] = {}
    children = [_start(ranks, share) for share in shares[1:]]
    for i in shares[0]:
        found[i] = replay_rank(*ranks[i])
    for share, child in zip(shares[1:], children, strict=True):
        results = _collect(child)
        if results is None or len(results) != len(share):
            results = [replay_rank(*ranks[i]) for i in share]
        found.update(zip(share, results, strict=True))
    out = []
    for i in range(len(ranks)):
        tell(i)
        out.append(found[i])
    return out


def _deal(ranks: list[tuple], n: int) -> list[list[int]]:
    """Rank positions in ``n`` shares of about equal events, largest ranks first.

    >>> _deal([([0] * 5,), ([0],), ([0] * 4,), ([0] * 2,)], 2)  # each rank: its events first
    [[0, 1], [2, 3]]
    """
    shares: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(ranks)), key=lambda i: -len(ranks[i][0])):
        least = load.index(min(load))
        shares[least].append(i)
        load[least] += len(ranks[i][0])
    return [sorted(share) for share in shares]


_SERVE = (
    "import sys; from forensics.replay import serve; serve(sys.stdin.buffer, sys.stdout.buffer)"
)


def _start(ranks: list[tuple], share: list[int]):
    """A worker process replaying ``share``, its input being sent by a thread: the pipe takes
    it only as fast as the worker reads, which it does once its interpreter has started (a
    wait of 0.1 s or more per chunk of ranks when this process waited)."""
    import os
    import pickle
    import subprocess
    import sys
    import threading
    from pathlib import Path

    env = dict(os.environ)
    # The worker imports this package from where this process found it.
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
    except OSError:
        return None
    given = pickle.dumps([ranks[i] for i in share], protocol=pickle.HIGHEST_PROTOCOL)

    def send() -> None:
        try:
            assert child.stdin is not None
            child.stdin.write(given)
            child.stdin.close()
        except OSError:  # the worker died before taking its input: it fails, _collect says
            child.kill()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return child, sender


def _collect(worker) -> list[RankReplay] | None:
    """A worker's results, or None when it failed."""
    import pickle

    if worker is None:
        return None
    child, sender = worker
    try:
        data = child.stdout.read()
        child.stdout.close()
        if child.wait() != 0:
            return None
        return pickle.loads(data)
    except (OSError, pickle.UnpicklingError, EOFError):
        return None
    finally:
        sender.join()


def serve(given, answer) -> None:
    """A worker: replay the ranks pickled on ``given``, pickle the results to ``answer``."""
    import pickle

    ranks = pickle.load(given)
    pickle.dump([replay_rank(*r) for r in ranks], answer, protocol=pickle.HIGHEST_PROTOCOL)
    answer.flush()


class _Rows:
    """A rank's timeline rows as the replay needs them."""

    def __init__(
        self, prompt_tokens, completion_tokens, size_known, victim, may_wait=None, admit_by=None
    ):
        import numpy as np

        self.prompt = np.asarray(prompt_tokens, dtype=np.int64)
        self.completion = np.asarray(completion_tokens, dtype=np.int64)
        self.size_known = np.asarray(size_known, dtype=np.bool_)
        self.victim = np.asarray(victim, dtype=np.bool_)
        self.may_wait = (
            np.zeros(len(self.prompt), dtype=np.bool_)
            if may_wait is None
            else np.asarray(may_wait, dtype=np.bool_)
        )
        self.admit_by = (
            np.full(len(self.prompt), NEVER, dtype=np.int64)
            if admit_by is None
            else np.asarray(admit_by, dtype=np.int64)
        )
        # In a queue run of three or more (replay_rank sets it).
        self.crowded = np.zeros(len(self.prompt), dtype=np.bool_)
        # Writes only its first page and its answer, as a victim does (replay_rank's other
        # pass adds the maybe victims).
        self.stale = self.victim


def _concat(parts: list[dict[str, np.ndarray]], dtypes: dict[str, str]) -> dict:
    import numpy as np

    return {
        name: np.concatenate([p[name] for p in parts]).astype(dtype, copy=False)
        if parts
        else np.zeros(0, dtype=dtype)
        for name, dtype in dtypes.items()
    }


def ceil_div(a, b):
    """Whole pages for ``a`` tokens of ``b`` per page; works on ints and NumPy arrays alike.

    >>> ceil_div(9, 4), ceil_div(8, 4), ceil_div(0, 4)
    (3, 2, 0)
    """
    return -(-a // b)


def _leading(
    values: Callable, start: int, end: int, limit: int, side: Literal["left", "right"]
) -> int:
    """How many values from ``start`` (before ``end``) keep their running sum at most
    ``limit`` (``side`` "right") or below it ("left"); ``values(a, b)`` gives those from a to b.
    Read in growing windows: the answer is usually a few hundred values on, in a list of
    millions.

    >>> import numpy as np
    >>> sizes = np.array([3, 4, 5, 6])
    >>> [_leading(lambda a, b: sizes[a:b], 0, 4, 7, side) for side in ("right", "left")]
    [2, 1]
    """
    import numpy as np

    total, at, window = 0, start, 256
    while at < end:
        sums = total + np.cumsum(values(at, min(at + window, end)))
        n = int(np.searchsorted(sums, limit, side=side))
        if n < len(sums):
            return at + n - start
        total, at, window = int(sums[-1]), at + window, window * 4
    return end - start


class _Segment:
    """One pool instance: from a pool start to the next (or the end of the rank's events)."""

    def __init__(
        self, pages: int, page_size: int, kind: np.ndarray, row: np.ndarray, at: np.ndarray
    ):
        self.pages, self.page_size = pages, page_size
        self.kind, self.row, self.at = kind, row, at
        self.shortfalls = self.guesses = self.crowded = 0

    def replay(self, rows: _Rows) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        import numpy as np

        ps = self.page_size
        alloc_at = np.flatnonzero(self.kind == ALLOC)  # event positions of the allocations
        owner = self.row[alloc_at].astype(np.int64)  # their timeline rows
        want = ceil_div(rows.prompt[owner] + rows.completion[owner], ps)
        n_alloc = len(alloc_at)
        # Which allocation (index into alloc_at) a free releases: the row's allocation in this
        # pool, only if it came first in event order (a free before its allocation, or of a
        # row allocated in another pool, releases nothing, as PagePool.free of an unknown key).
        alloc_of_row = np.full(len(rows.prompt), -1, dtype=np.int64)
        alloc_of_row[owner[::-1]] = np.arange(n_alloc - 1, -1, -1)  # a row's first allocation
        free_at = np.flatnonzero(self.kind == FREE)
        freed_alloc = alloc_of_row[self.row[free_at]]
        effective = freed_alloc >= 0
        effective[effective] = alloc_at[freed_alloc[effective]] < free_at[effective]
        free_at, freed_alloc = free_at[effective], freed_alloc[effective]
        # A stretch's slice of the free list is kept only while an allocation in it has yet to
        # be released (a page pool's worth of memory per stretch otherwise).
        will_free = np.zeros(n_alloc, dtype=np.int64)
        will_free[freed_alloc] = 1
        pending: list[int] = []

        taken = np.zeros(n_alloc, dtype=np.int64)  # pages each allocation got
        region_of = np.zeros(n_alloc, dtype=np.int64)  # which stretch's slice holds them
        offset = np.zeros(n_alloc, dtype=np.int64)  # where in that slice they start
        short = np.zeros(n_alloc, dtype=np.bool_)
        # Released while it still waited in the preallocation queue: such an allocation is
        # admitted late, against the logs, and its pages are never given back.
        lost = np.zeros(n_alloc, dtype=np.bool_)
        may_wait = rows.may_wait[owner]
        regions: list[np.ndarray | None] = []
        writer = np.full(self.pages + 1, -1, dtype=np.int64)
        free_list = np.arange(1, self.pages + 1, dtype=np.int64)
        pos = 0
        released_upto = 0  # frees before this index of free_at are merged in already
        # The queue: an allocation whose time is an arrival, not the engine's allocation, waits
        # for pages when the pool cannot hold it (SGLang's decode preallocation queue, first in,
        # first out). ``clock`` is the event position of the free that admitted the last one to
        # wait; an allocation that arrived before it waited behind.
        clock = -1
        admitted_at = 0  # the instant of that free
        reads: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        victims: list[tuple[int, int]] = []  # (allocation, unknown pages)

        def merge(k: int, upto: int) -> None:
            """Merge the frees before index ``upto`` of free_at into the free list, for
            allocation ``k`` (an allocation not yet made when its release comes is lost)."""
            nonlocal free_list, pos, released_upto
            gone = freed_alloc[released_upto:upto]
            released_upto = upto
            early = gone >= k
            if early.any():
                lost[gone[early]] = True
                will_free[gone[early]] = 0
                gone = gone[~early]
            parts = [free_list[pos:]] + self._pages_of(gone, regions, region_of, offset, taken)
            for r, n in zip(*np.unique(region_of[gone], return_counts=True), strict=True):
                pending[r] -= int(n)
                if not pending[r]:
                    regions[r] = None
            # Sorted runs (the rest of the list, each allocation's slice): a stable sort
            # (timsort) merges runs in near-linear time.
            free_list, pos = np.sort(np.concatenate(parts), kind="stable"), 0

        def admission(deficit: int) -> int:
            """The index into free_at of the first free after those merged that leaves room
            for ``deficit`` more pages, or len(free_at) when none does. (An allocation not yet
            made has taken nothing: its release frees nothing.)"""
            return released_upto + _leading(
                lambda a, b: taken[freed_alloc[a:b]], released_upto, len(free_at), deficit, "left"
            )

        k = 0
        while k < n_alloc:
            if want[k] > len(free_list) - pos:
                # The free list is short: merge what was freed before this allocation (or
                # before the free that admitted the one it waited behind).
                merge(k, int(np.searchsorted(free_at, max(alloc_at[k], clock), side="right")))
                if want[k] > len(free_list) and may_wait[k]:
                    # It waits until enough is freed, and what arrives meanwhile waits behind.
                    j = admission(int(want[k]) - len(free_list))
                    merge(k, j + 1)
                    clock = int(free_at[j]) if j < len(free_at) else len(self.kind)
                    # Admitted at that free's instant (never, if no free makes room).
                    admitted_at = int(self.at[clock]) if clock < len(self.kind) else NEVER
                if want[k] > len(free_list):
                    short[k] = True
            # The stretch: allocation k (it fits now, or takes what is left) and every later
            # one that fits in what remains of this free list.
            first = min(int(want[k]), len(free_list) - pos)
            room = len(free_list) - pos - first
            stop = k + 1
            if room:
                stop += _leading(lambda a, b: want[a:b], stop, n_alloc, room, "right")
            sizes = want[k:stop].copy()
            sizes[0] = first
            ends = pos + np.cumsum(sizes)
            taken[k:stop] = sizes
            offset[k:stop] = ends - sizes - pos
            region_of[k:stop] = len(regions)
            region = free_list[pos : int(ends[-1])]
            # Against the logs: an allocation released before it was admitted, one admitted
            # after its first token, or one the engine logged at its own time held behind an
            # arrival that waited.
            late = (admitted_at == NEVER) | (admitted_at > rows.admit_by[owner[k:stop]])
            short[k:stop] |= lost[k:stop] | (
                (alloc_at[k:stop] < clock) & (~may_wait[k:stop] | late)
            )
            pending.append(int(will_free[k:stop].sum()))
            regions.append(region if pending[-1] else None)
            pos = int(ends[-1])
            members = np.arange(k, stop)
            for v in members[rows.victim[owner[k:stop]]]:
                unknown = self._read(v, region, offset, taken, owner, rows, writer, reads)
                victims.append((int(v), unknown))
            self._write(region, members, sizes, owner, rows, writer)
            k = stop
        self.shortfalls += int(short.sum())
        self.guesses += int((~rows.size_known[owner]).sum())
        crowded = rows.crowded[owner]
        self.crowded += int(crowded.sum())
        # Drift before an allocation: an earlier one of this pool did not fit or was a guess.
        doubt = short | ~rows.size_known[owner]
        earlier: np.ndarray = np.cumsum(doubt) - doubt
        at = np.array([v for v, _ in victims], dtype=np.int64)
        if reads:
            victim_rows, writers, counts = (np.concatenate(c) for c in zip(*reads, strict=True))
        else:
            victim_rows = writers = counts = np.zeros(0, dtype=np.int64)
        # A queue run of three or more took its pages in an order neither replayed order may
        # be: which of its members wrote a page it took is not settled, and a victim in one
        # may have had other pages, so its sources are approximate (but not every later
        # victim's: the run's pages are the same in any order).
        settled = ~rows.crowded[writers]
        state = {
            "row": owner[at],
            "drifted": (earlier[at] > 0) | short[at] | crowded[at],
            "unknown_pages": np.array([u for _, u in victims], dtype=np.int64),
            "unsettled": np.isin(owner[at], victim_rows[~settled]),
        }
        return {
            "victim": victim_rows,
            "writer": writers,
            "tokens": counts * ps,
            "settled": settled,
        }, state

    @staticmethod
    def _pages_of(gone, regions, region_of, offset, taken) -> list[np.ndarray]:
        """The pages of the allocations ``gone``, gathered stretch by stretch."""
        import numpy as np

        out: list[np.ndarray] = []
        if not len(gone):
            return out
        by_region = region_of[gone]
        for r in np.unique(by_region):
            these = gone[by_region == r]
            lengths = taken[these]
            total = int(lengths.sum())
            if not total:
                continue
            # The concatenated ranges [offset, offset + length) of these allocations.
            starts = np.repeat(offset[these] - (np.cumsum(lengths) - lengths), lengths)
            out.append(regions[r][starts + np.arange(total)])
        return out

    def _read(self, v, region, offset, taken, owner, rows, writer, reads) -> int:
        """What victim allocation ``v`` reads from its stale pages; returns the pages whose
        writer is unknown. Must run before the stretch's writes."""
        import numpy as np

        ps = self.page_size
        me = int(owner[v])
        pages = region[offset[v] : offset[v] + taken[v]]
        stale = pages[1 : ceil_div(max(int(rows.prompt[me]), 1), ps)]
        who = writer[stale]
        known = who[(who >= 0) & (who != me)]
        if len(known):
            ids, counts = np.unique(known, return_counts=True)
            reads.append((np.full(len(ids), me, dtype=np.int64), ids, counts))
        return int((who < 0).sum())

    def _write(self, region, members, sizes, owner, rows, writer) -> None:
        """Every page of the stretch gets its writer: all of an ordinary allocation's, and of a
        victim's only its first page and those of its generated tokens."""
        import numpy as np

        total = len(region)
        if not total:
            return
        who = np.repeat(owner[members], sizes)
        if not rows.stale[owner[members]].any():
            writer[region] = who
            return
        ps = self.page_size
        at = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        prompt, completion = rows.prompt[who], rows.completion[who]
        own = (at == 0) | ((at >= prompt // ps) & (at < ceil_div(prompt + completion, ps)))
        keep = ~rows.stale[who] | own
        writer[region[keep]] = who[keep]
