"""The array replay of a decode rank against PagePool walked one event at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.attribution import PagePool, _ceil_div, stale_read, unknown_stale_pages
from forensics.replay import (
    ALLOC,
    FREE,
    MIN_FIT_ROWS,
    NEVER,
    POOL_START,
    guess_generated,
    replay_rank,
)


def walk_events(
    kind, row, pool_tokens, page_size, prompt, completion, client, victim, wait, at, admit_by
):
    """The rule event by event with PagePool: the specification the array replay must meet.

    An allocation timed by its arrival (``wait``) that the pool cannot hold waits in a queue,
    first in, first out, and everything that arrives after it waits behind it; the queue is
    served after every free. Against the logs (a shortfall): an allocation the pool could not
    hold that may not wait, one that may not wait but was held behind the queue, one admitted
    after ``admit_by`` (its first token), and one whose release came while it waited (its pages
    are then never given back). A pool's restart, or the end of the events, admits what still
    waits with what is left, never in time.
    """
    pool = None
    size = 1
    reads, states = set(), []
    shortfalls = guesses = 0
    queue: list[int] = []
    lost: set[int] = set()

    def admit(r: int, held_back: bool, late: bool = False) -> None:
        drifted_before = bool(pool.shortfalls or pool.guesses)
        before = pool.shortfalls
        pages = pool.alloc(r, _ceil_div(prompt[r] + completion[r], size))
        if (held_back or late or r in lost) and pool.shortfalls == before:
            pool.shortfalls += 1
        if not client[r]:
            pool.guesses += 1
        own_short = pool.shortfalls > before
        if victim[r]:
            unknown = unknown_stale_pages(pool, pages, prompt[r], size)
            states.append((r, drifted_before or own_short, unknown))
            for writer, n in stale_read(pool, pages, r, prompt[r], completion[r], size).items():
                reads.add((r, writer, n * size))
        else:
            pool.writer[pages] = r

    def serve(instant: int | None) -> None:
        """Admit what the pool can hold now (at ``instant``; None: everything, never in time)."""
        while queue:
            r = queue[0]
            fits = pool.fits(_ceil_div(prompt[r] + completion[r], size))
            if not fits and wait[r] and instant is not None:
                return
            queue.pop(0)
            admit(r, held_back=not wait[r], late=instant is None or instant > admit_by[r])

    for k, r, tokens, new_size, t in zip(kind, row, pool_tokens, page_size, at, strict=True):
        if k == POOL_START:
            if pool is not None:
                serve(None)
                shortfalls, guesses = shortfalls + pool.shortfalls, guesses + pool.guesses
            size = new_size
            pool = PagePool(tokens // size)
            lost.clear()
            continue
        if pool is None:
            continue
        if k == FREE:
            if r in queue:
                lost.add(r)
            pool.free(r)
            serve(t)
            continue
        if queue:
            queue.append(r)
        elif wait[r] and not pool.fits(_ceil_div(prompt[r] + completion[r], size)):
            queue.append(r)
        else:
            admit(r, held_back=False)
    if pool is not None:
        serve(None)
        shortfalls, guesses = shortfalls + pool.shortfalls, guesses + pool.guesses
    return reads, states, shortfalls, guesses


@st.composite
def ranks(draw):
    """A rank's history: rows allocated once and freed at most once (sometimes never, or
    before their allocation, as broken logs do), pools restarted, small pools that run
    short, victims, rows without a client record."""
    n_rows = draw(st.integers(0, 40))
    prompt = draw(st.lists(st.integers(0, 60), min_size=n_rows, max_size=n_rows))
    completion = draw(st.lists(st.integers(0, 12), min_size=n_rows, max_size=n_rows))
    client = [True] * n_rows
    if draw(st.booleans()):
        client = draw(st.lists(st.booleans(), min_size=n_rows, max_size=n_rows))
    victim = draw(st.lists(st.booleans(), min_size=n_rows, max_size=n_rows))
    # Rows timed by their arrival wait for room: none, all (client times alone) or some.
    wait = draw(
        st.one_of(
            st.just([False] * n_rows),
            st.just([True] * n_rows),
            st.lists(st.booleans(), min_size=n_rows, max_size=n_rows),
        )
    )
    events = [(draw(st.integers(0, 3)), POOL_START, -1)]
    for r in range(n_rows):
        at = draw(st.integers(0, 100))
        events.append((at, ALLOC, r))
        fate = draw(st.sampled_from(["free", "free", "free", "never", "before"]))
        if fate == "free":
            events.append((at + draw(st.integers(0, 30)), FREE, r))
        elif fate == "before":
            events.append((at - draw(st.integers(1, 5)), FREE, r))
    for _ in range(draw(st.integers(0, 2))):
        events.append((draw(st.integers(-5, 110)), POOL_START, -1))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    kind = [e[1] for e in events]
    row = [max(e[2], 0) for e in events]
    pool_tokens = [draw(st.integers(8, 400)) if k == POOL_START else 0 for k in kind]
    page_size = [draw(st.sampled_from([1, 2, 4])) if k == POOL_START else 0 for k in kind]
    at = [e[0] for e in events]
    # The first token: unknown, or some time after the arrival (a long wait runs past it).
    admit_by = [draw(st.one_of(st.just(NEVER), st.integers(0, 140))) for _ in range(n_rows)]
    return (
        kind,
        row,
        pool_tokens,
        page_size,
        prompt,
        completion,
        client,
        victim,
        wait,
        at,
        admit_by,
    )


@settings(max_examples=400, deadline=None)
@given(ranks())
def test_array_replay_matches_the_event_walk(history):
    kind, row, pool_tokens, page_size, prompt, completion, client, victim, wait, at, admit_by = (
        history
    )
    # The walk takes the sizes the replay takes: a leg of unknown count sized by its time.
    completion = guess_generated(
        np.array(kind), np.array(row), np.array(at), prompt, completion, client, wait
    ).tolist()
    history = (*history[:5], completion, *history[6:])
    reads, states, shortfalls, guesses = walk_events(*history)
    out = replay_rank(
        *(np.array(v, dtype=np.int64) for v in history[:6]),
        np.array(client, dtype=bool),
        np.array(victim, dtype=bool),
        np.array(wait, dtype=bool),
        np.array(at, dtype=np.int64),
        np.array(admit_by, dtype=np.int64),
    )
    got = set(zip(*(out.reads[c].tolist() for c in ("victim", "writer", "tokens")), strict=True))
    assert got == reads
    got_states = list(
        zip(*(out.victims[c].tolist() for c in ("row", "drifted", "unknown_pages")), strict=True)
    )
    assert sorted(got_states) == sorted(states)
    assert (out.shortfalls, out.guesses) == (shortfalls, guesses)


def one_pool(pages: int, kind, row, prompt, completion, victim, **extra):
    """Replay one pool of ``pages`` one-token pages, started by the first event, every size
    known: the rank of a hand-written test."""
    n = len(kind)
    return replay_rank(
        np.array(kind),
        np.array(row),
        np.array([pages] + [0] * (n - 1)),
        np.ones(n, dtype=int),
        prompt_tokens=np.array(prompt),
        completion_tokens=np.array(completion),
        size_known=np.ones(len(prompt), dtype=bool),
        victim=np.array(victim, dtype=bool),
        **extra,
    )


def test_a_victim_reads_the_writers_of_pages_freed_before_it():
    # Pool of 10 pages. A takes 1-3, B 4-6, both freed; V needs 8 pages: 4 are left, so the
    # list is merged (1-10) and V takes 1-8: pages 2-3 were A's, 4-6 B's, 7 never written.
    kind = [POOL_START, ALLOC, ALLOC, FREE, FREE, ALLOC]
    row = [0, 0, 1, 0, 1, 2]
    out = one_pool(10, kind, row, [3, 3, 7], [0, 0, 1], [False, False, True])
    assert sorted(zip(out.reads["writer"].tolist(), out.reads["tokens"].tolist(), strict=True)) == [
        (0, 2),
        (1, 3),
    ]
    assert out.victims["unknown_pages"].tolist() == [1]
    assert out.victims["drifted"].tolist() == [False]


def reads_of(out) -> list[tuple[int, int, bool]]:
    """(writer, tokens, settled) of every read, by writer."""
    r = out.reads
    return sorted(
        zip(r["writer"].tolist(), r["tokens"].tolist(), r["settled"].tolist(), strict=True)
    )


def test_a_queue_run_is_replayed_in_both_orders():
    # As above, but A and B were admitted together in an order the logs do not settle (one
    # queue run). Reversed, B takes 1-3 and A 4-6: V reads 2 tokens of B and 3 of A. Both
    # writers are read either way (settled), each with its larger amount; V is unsettled.
    kind = [POOL_START, ALLOC, ALLOC, FREE, FREE, ALLOC]
    row = [0, 0, 1, 0, 1, 2]
    out = one_pool(10, kind, row, [3, 3, 7], [0, 0, 1], [False, False, True], queue_run=[4, 4, -1])
    assert reads_of(out) == [(0, 3, True), (1, 3, True)]
    assert out.victims["unsettled"].tolist() == [True]
    assert out.victims["drifted"].tolist() == [False]
    assert out.queue_runs == 1
    # Without the run, one order: A 2, B 3, settled, and nothing else to say.
    out = one_pool(10, kind, row, [3, 3, 7], [0, 0, 1], [False, False, True])
    assert reads_of(out) == [(0, 2, True), (1, 3, True)]
    assert out.victims["unsettled"].tolist() == [False] and out.queue_runs == 0


def test_a_writer_read_in_one_order_only_is_not_settled():
    # Pool of 10: A (1-3) and B (4-6) one queue run, C takes 7-10 and keeps them; A and B are
    # freed; V (2 pages) merges 1-6 back and takes 1-2. Its stale page 2 is A's in the logged
    # order and B's in the other: each is named, neither settled.
    kind = [POOL_START, ALLOC, ALLOC, ALLOC, FREE, FREE, ALLOC]
    row = [0, 0, 1, 2, 0, 1, 3]
    out = one_pool(
        10,
        kind,
        row,
        [3, 3, 4, 2],
        [0, 0, 0, 0],
        [False, False, False, True],
        queue_run=[7, 7, -1, -1],
    )
    assert reads_of(out) == [(0, 1, False), (1, 1, False)]
    assert out.victims["unsettled"].tolist() == [True]


def test_a_queue_run_the_victim_never_reads_changes_nothing():
    # C (1-4) is freed; A (5-7) and B (8-10), one queue run, still hold their pages when V
    # (3 pages) merges C's back and takes 1-3: it reads C's pages 2-3 in either order.
    kind = [POOL_START, ALLOC, ALLOC, ALLOC, FREE, ALLOC]
    row = [0, 0, 1, 2, 0, 3]
    out = one_pool(
        10,
        kind,
        row,
        [4, 3, 3, 3],
        [0, 0, 0, 0],
        [False, False, False, True],
        queue_run=[-1, 9, 9, -1],
    )
    assert reads_of(out) == [(0, 2, True)]
    assert out.victims["unsettled"].tolist() == [False]
    assert out.queue_runs == 1


def test_a_queue_run_of_three_is_never_settled():
    # A, B and C (2 pages each) are one queue run of three; D takes 7-10 and keeps them; the
    # three are freed and V (3 pages) merges 1-6 back and takes 1-3, reading pages 2 and 3.
    # Logged order A, B, C: A's page 2, B's page 3; reversed: C's and B's. The run's other
    # orders (B first, say) are tried by neither, so no read of its pages is settled, B's
    # included; V itself is not in the run, so its replay has not drifted.
    kind = [POOL_START, ALLOC, ALLOC, ALLOC, ALLOC, FREE, FREE, FREE, ALLOC]
    row = [0, 0, 1, 2, 3, 0, 1, 2, 4]
    sizes = dict(prompt=[2, 2, 2, 4, 3], completion=[0] * 5, victim=[False] * 4 + [True])

    def replay(queue_run):
        return one_pool(10, kind, row, **sizes, queue_run=queue_run)

    out = replay([5, 5, 5, -1, -1])
    assert reads_of(out) == [(0, 1, False), (1, 1, False), (2, 1, False)]
    assert out.victims["unsettled"].tolist() == [True]
    assert out.victims["drifted"].tolist() == [False]
    assert out.crowded == 3 and out.queue_runs == 1
    # V in such a run has its own pages in doubt: its replay counts as drifted.
    out = replay([-1, -1, -1, 6, 6])
    assert out.victims["drifted"].tolist() == [False]  # a run of two: both orders tried
    out = replay([-1, 6, -1, 6, 6])
    assert out.victims["drifted"].tolist() == [True]


def queued_rank(wait: bool, first_token: int = NEVER):
    """Pool of 10 pages. A (8 pages) arrives at 0, then V (a victim wanting 5) at 1, then C
    (1 page) at 2; A is released at 10, then V and C. Timed by arrival, V and C wait for A's
    pages; V's first token came at ``first_token``."""
    kind = [POOL_START, ALLOC, ALLOC, ALLOC, FREE, FREE, FREE]
    row = [0, 0, 1, 2, 0, 1, 2]
    return one_pool(
        10,
        kind,
        row,
        [8, 4, 1],
        [0, 1, 0],
        [False, True, False],
        may_wait=np.full(3, wait),
        at=np.array([0, 0, 1, 2, 10, 20, 30]),
        admit_by=np.array([NEVER, first_token, NEVER]),
    )


def test_an_arrival_the_pool_cannot_hold_waits_for_pages_freed_after_it():
    # Waiting: A's release merges pages 1-10 back and V takes 1-5, reading A's pages 2-4.
    # C arrived while V waited, so it waits behind it (first in, first out) and takes page 6.
    out = queued_rank(wait=True, first_token=12)
    assert sorted(zip(out.reads["writer"].tolist(), out.reads["tokens"].tolist(), strict=True)) == [
        (0, 3)
    ]
    assert out.victims["drifted"].tolist() == [False]
    assert out.shortfalls == 0
    # Not waiting (an engine leg's time is its allocation): V takes pages 9-10 only, short, and
    # the replay has drifted from the logs.
    out = queued_rank(wait=False)
    assert out.victims["drifted"].tolist() == [True]
    assert out.shortfalls >= 1


def test_a_wait_past_the_first_token_is_against_the_logs():
    # V's first token came at 5, before A's release at 10 made room: the engine cannot have
    # held it that long, so the replay disagrees with the logs and V's sources are approximate.
    out = queued_rank(wait=True, first_token=5)
    assert out.shortfalls == 1
    assert out.victims["drifted"].tolist() == [True]


def test_an_arrival_released_before_the_pool_could_hold_it_is_against_the_logs():
    # Pool of 4 pages: A holds 3; B (3 pages, waits) is released at once, before A is: it
    # finished before it could have had its pages, so the replay admits it late and counts the
    # disagreement. B's pages are never given back, so V (2 pages) then finds 1: short too,
    # and drifted.
    kind = [POOL_START, ALLOC, ALLOC, FREE, FREE, ALLOC]
    row = [0, 0, 1, 1, 0, 2]
    out = one_pool(4, kind, row, [3, 3, 2], [0, 0, 0], [False, False, True], may_wait=[1, 1, 1])
    assert out.shortfalls == 2
    assert out.victims["drifted"].tolist() == [True]


def test_an_ordinary_rank_reads_nothing():
    # No victim: pages are written and reused, nobody reads a stale page.
    kind = [POOL_START, ALLOC, FREE, ALLOC, FREE]
    out = one_pool(4, kind, [0, 0, 0, 1, 1], [3, 3], [1, 1], [False, False])
    assert len(out.reads["victim"]) == 0 and len(out.victims["row"]) == 0
    assert out.shortfalls == 0


def random_ranks(count: int = 4, seed: int = 7) -> list[tuple]:
    rng = np.random.default_rng(seed)
    ranks = []
    for _ in range(4):
        n = 300
        alloc = np.sort(rng.integers(0, 10_000, n))
        free = alloc + rng.integers(1, 400, n)
        at = np.concatenate([[-1], alloc, free])
        kind = np.concatenate([[POOL_START], np.full(n, ALLOC), np.full(n, FREE)])
        row = np.concatenate([[0], np.arange(n), np.arange(n)])
        order = np.lexsort((row, kind, at))
        pool = np.zeros(2 * n + 1, dtype=np.int64)
        pool[0] = 4_000
        size = np.ones(2 * n + 1, dtype=np.int64)
        size[0] = 4
        ranks.append(
            (
                kind[order],
                row[order],
                pool[order],
                size[order],
                rng.integers(1, 200, n),
                rng.integers(0, 50, n),
                np.ones(n, dtype=bool),
                rng.random(n) < 0.05,
            )
        )
    return ranks


def same_replays(here, there) -> None:
    assert sum(len(r.reads["victim"]) for r in here) > 0
    assert len(here) == len(there)
    for a, b in zip(here, there, strict=True):
        for name in ("victim", "writer", "tokens"):
            assert a.reads[name].tolist() == b.reads[name].tolist()
        assert a.victims["unknown_pages"].tolist() == b.victims["unknown_pages"].tolist()


def test_ranks_replayed_in_worker_processes_match_this_process(monkeypatch):
    import forensics.replay as replay

    ranks = random_ranks()
    here = replay.replay_ranks(ranks, workers=1)
    monkeypatch.setattr(replay, "PARALLEL_EVENTS", 0)
    told: list[int] = []
    same_replays(here, replay.replay_ranks(ranks, workers=3, starting=told.append))
    assert told == [0, 1, 2, 3]


def test_a_failed_worker_has_its_share_replayed_here(monkeypatch):
    import forensics.replay as replay

    ranks = random_ranks()
    here = replay.replay_ranks(ranks, workers=1)
    monkeypatch.setattr(replay, "PARALLEL_EVENTS", 0)
    monkeypatch.setattr(replay, "_SERVE", "import sys; sys.exit(3)")
    same_replays(here, replay.replay_ranks(ranks, workers=2))


def test_workers_do_not_run_the_callers_script_again(tmp_path):
    # A script without a main guard: a worker that re-ran it would replay (and print) again.
    import subprocess
    import sys

    script = tmp_path / "caller.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import forensics.replay as replay\n"
        "from test_replay import random_ranks\n"
        "replay.PARALLEL_EVENTS = 0\n"
        "print(len(replay.replay_ranks(random_ranks(), workers=2)))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "4\n"


def test_two_orders_that_disagree_on_their_victims_leave_the_logged_order_approximate():
    from forensics.replay import RankReplay, _settle

    def one(victim_row: int) -> RankReplay:
        reads = {
            "victim": np.array([victim_row]),
            "writer": np.array([0]),
            "tokens": np.array([4]),
            "settled": np.array([True]),
        }
        victims = {
            "row": np.array([victim_row]),
            "drifted": np.array([False]),
            "unknown_pages": np.array([0]),
            "unsettled": np.array([False]),
        }
        return RankReplay(reads, victims)

    out = _settle(one(1), one(2), n_rows=3, runs=1)
    assert out.reads["victim"].tolist() == [1] and out.victims["row"].tolist() == [1]
    assert out.victims["drifted"].tolist() == [True] and out.queue_runs == 1


def test_a_maybe_victim_is_replayed_as_writer_and_as_victim():
    # Pool of 4: A (1-4) is freed; M (a response judged possible: its prompt may have gone
    # over its prefill limit) takes 1-4 and is freed; V (4 pages) takes them again. Had M been
    # affected it wrote only its first page and left A's KV on pages 2-4 (its answer is empty):
    # V read either M's prompt or A's, and neither is settled. Without the flag, M alone.
    kind = [POOL_START, ALLOC, FREE, ALLOC, FREE, ALLOC]
    row = [0, 0, 0, 1, 1, 2]
    sizes = dict(prompt=[4, 4, 4], completion=[0, 0, 0], victim=[False, False, True])
    out = one_pool(4, kind, row, **sizes, maybe_victim=[False, True, False])
    assert reads_of(out) == [(0, 3, False), (1, 3, False)]
    assert out.victims["unsettled"].tolist() == [True] and out.maybe == 1
    out = one_pool(4, kind, row, **sizes)
    assert reads_of(out) == [(1, 3, True)] and out.maybe == 0
    # A flag on a response that changes nothing any victim read is not reported.
    out = one_pool(4, kind, row, **sizes, maybe_victim=[True, False, False])
    assert reads_of(out) == [(1, 3, True)] and out.maybe == 0


def _legs(n: int, per_token: int = 20_000):
    """``n`` decode legs, one after another: each held its pages 2 ms for the transfer, 3 µs
    per prompt token and ``per_token`` µs per generated token."""
    prompt = np.arange(n) * 100 + 500
    made = np.arange(n) % 7 * 30 + 10
    held = 2_000 + prompt * 3 + made * per_token
    kind = np.array([ALLOC] * n + [FREE] * n)
    row = np.concatenate([np.arange(n), np.arange(n)])
    instants = np.concatenate([np.arange(n) * 10, np.arange(n) * 10 + held])
    return kind, row, instants, prompt, made


def test_an_uncounted_leg_is_sized_by_how_long_it_held_its_pages():
    kind, row, instants, prompt, made = _legs(40)
    known = np.ones(40, dtype=bool)
    known[[3, 17, 30]] = False
    out = guess_generated(
        kind, row, instants, prompt, np.where(known, made, 0), known, np.zeros(40, bool)
    )
    assert out[~known].tolist() == made[~known].tolist()
    assert out[known].tolist() == made[known].tolist()  # counted rows keep their count


def test_the_guess_needs_enough_counted_legs_and_leaves_client_rows_alone():
    kind, row, instants, prompt, made = _legs(MIN_FIT_ROWS)
    known = np.ones(MIN_FIT_ROWS, dtype=bool)
    known[0] = False
    counted = np.where(known, made, 0)
    # One counted leg short of a fit: the uncounted one keeps its prompt alone.
    few = guess_generated(kind, row, instants, prompt, counted, known, np.zeros(len(known), bool))
    assert few[0] == 0
    kind, row, instants, prompt, made = _legs(MIN_FIT_ROWS + 1)
    known = np.ones(MIN_FIT_ROWS + 1, dtype=bool)
    known[0] = False
    counted = np.where(known, made, 0)
    waits = np.zeros(len(known), dtype=bool)
    assert guess_generated(kind, row, instants, prompt, counted, known, waits)[0] == made[0]
    # A row timed by a client record is no leg: its time says nothing of its tokens.
    waits[0] = True
    assert guess_generated(kind, row, instants, prompt, counted, known, waits)[0] == 0


def test_the_guess_stays_within_what_counted_legs_generated():
    kind, row, instants, prompt, made = _legs(30)
    known = np.ones(30, dtype=bool)
    known[[0, 1]] = False
    instants = instants.copy()
    instants[30] = instants[0] + 10**9  # held for 17 minutes: stuck, not generating
    instants[31] = instants[1] + 1  # freed at once
    out = guess_generated(
        kind, row, instants, prompt, np.where(known, made, 0), known, np.zeros(30, bool)
    )
    assert out[0] == made[known].max() and out[1] == 1
    # A rank whose legs' times do not grow with their tokens gives no guess.
    flat = instants.copy()
    flat[30:] = np.arange(30) * 10 + 5_000
    same = guess_generated(
        kind, row, flat, prompt, np.where(known, made, 0), known, np.zeros(30, bool)
    )
    assert same[0] == 0 and same[1] == 0


def test_a_few_stalled_legs_do_not_tip_the_fit():
    # 200 legs with 15 % jitter in their step time, 12 of them held 10 s to 17 min longer than
    # their tokens took (a client gone, a stalled transfer). Fitted on all of them, the rates
    # were so far off that the guess was worse than none (median error above the mean count).
    rng = np.random.default_rng(2)
    n = 200
    prompt = rng.integers(200, 20_000, n)
    made = rng.integers(1, 800, n)
    held = ((2_000 + prompt * 3 + made * 20_000) * rng.uniform(0.9, 1.2, n)).astype(np.int64)
    stalled = rng.choice(n, 12, replace=False)
    held[stalled] += rng.integers(10**7, 10**9, len(stalled))
    uncounted = rng.choice(np.setdiff1d(np.arange(n), stalled), 30, replace=False)
    known = np.ones(n, dtype=bool)
    known[uncounted] = False
    kind = np.array([ALLOC] * n + [FREE] * n)
    row = np.concatenate([np.arange(n), np.arange(n)])
    instants = np.concatenate([np.arange(n) * 10, np.arange(n) * 10 + held])
    out = guess_generated(
        kind, row, instants, prompt, np.where(known, made, 0), known, np.zeros(n, bool)
    )
    error = np.abs(out[uncounted] - made[uncounted])
    assert np.median(error) < 0.1 * made[uncounted].mean()
