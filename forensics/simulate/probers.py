"""Deliberate probers: customer tenants looking for the prefill limit to read others' KV.

A prober is an ordinary customer account (its id, keys and addresses look like any other; it
keeps its short-prompt traffic). It sends padding of chosen lengths and reads each answer: an
over-limit prompt on a vulnerable prefill node comes back at once, with someone else's content
(``fleet.VICTIM``); any other node processes it normally (minutes of prefill, an ordinary
answer). Requests are routed at random across prefill nodes with different limits, so the
oracle is noisy: above 681,274 tokens only the two undersized nodes leak (about half the
requests), above 917,498 three of four. Probers work in the window when the undersized pools
are live (from a day after the start until the configuration change) and give up when the
leak stops answering.

- ``binary_search``: bisects a range (about 450K-1.04M) one request at a time, waiting for each
  answer; three passes, the later ones asking up to three times before taking a length as
  under the limit; then exploits just above the lowest length that leaked, in runs of a few
  requests hours apart.
- ``sweep``: fixed-step lengths across 400K tokens from about 600K, a few seconds apart without
  waiting (coarse), then a finer step just below the first length that leaked, then a short
  harvest there; a second round a day or two later.
- ``repeat``: a short discovery at round lengths (50K apart, upward from 600K-700K, waiting for
  each answer), then the first one that leaked, exactly, many times over hours and days (a
  scheduled harvester).
- ``slow``: a mid-sized customer with ordinary traffic that slips in 10-20 fresh probes, one
  per slot of the window (hours apart, no bursts), each a distinct length narrowing in around
  the limit it already roughly knows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from forensics.simulate.config import US, SimConfig, max_req_input_len
from forensics.simulate.fleet import OK, VICTIM

if TYPE_CHECKING:
    from forensics.simulate.traffic import Sender, Tenants

PROBE, EXPLOIT = 1, 2  # Traffic.phase
DAY = 86_400 * US
# Answer lengths: a probe needs a few tokens to see whose content came back; a harvest asks
# for long answers (natural length log-normal, median ~650 tokens) under a larger max_tokens.
PROBE_MAX_TOKENS = (16, 64)
EXPLOIT_MAX_TOKENS = 2048
EXPLOIT_COMPLETION = (6.5, 0.8)


@dataclass
class ProberStats:
    """What one prober sent (for the truth summary)."""

    tenant: int
    strategy: str
    requests: int = 0
    probes: int = 0
    exploits: int = 0


class _Prober:
    def __init__(self, sender: Sender, tenant: int, strategy: str, cap: int):
        self.sender, self.tenant, self.cap = sender, tenant, cap
        self.rng = sender.rng
        self.client = sender.client(tenant)  # one key, one machine
        self.stats = ProberStats(tenant, strategy)

    def send(self, t_us: int, prompt: int, phase: int):
        """(outcome, answer back at) for one request; None past the window or the cap."""
        if self.stats.requests >= self.cap:
            return None
        rng = self.rng
        if phase == PROBE:
            max_tokens = int(rng.integers(*PROBE_MAX_TOKENS))
            completion = max_tokens + int(rng.integers(0, 400))
        else:
            max_tokens = EXPLOIT_MAX_TOKENS
            completion = max(1, round(math.exp(rng.normal(*EXPLOIT_COMPLETION))))
        r = self.sender.send(
            self.tenant, t_us, prompt, completion, max_tokens, self.client, phase=phase
        )
        if r is None:
            return None
        st = self.stats
        st.requests += 1
        st.probes += phase == PROBE
        st.exploits += phase == EXPLOIT
        return r[1], r[3]

    def pause(self, lo_s: float, hi_s: float) -> int:
        return round(self.rng.uniform(lo_s, hi_s) * US)


def prober_traffic(
    cfg: SimConfig, tenants: Tenants, budget: int, sender: Sender
) -> list[ProberStats]:
    """Every prober tenant's requests, sent through ``sender`` (at most ``budget`` in all)."""
    probers = [(i, s) for i, s in enumerate(tenants.strategies) if s]
    if not probers:
        return []
    lo, hi = cfg.us(cfg.start) + DAY, min(cfg.us(cfg.config_change_at), cfg.us(cfg.end))
    if hi - lo < DAY:  # a short or unusual window: use all of it
        lo, hi = cfg.us(cfg.start), cfg.us(cfg.end)
    limits = [max_req_input_len(p, cfg.context_length) for p in cfg.prefill_pools]
    vulnerable = [x for x in limits if x < cfg.context_length - 6] or limits
    run = {"binary_search": _binary_search, "sweep": _sweep, "repeat": _repeat, "slow": _slow}
    out = []
    for tenant, strategy in probers:
        p = _Prober(sender, tenant, strategy, budget // len(probers))
        run[strategy](p, lo, hi, min(vulnerable), cfg.context_length)
        out.append(p.stats)
    return out


def _binary_search(p: _Prober, lo: int, hi: int, limit: int, context: int) -> None:
    rng = p.rng
    t = lo + round(rng.uniform(0, 0.4) * (hi - lo))
    lo_len = int(rng.integers(450_000, 560_000))
    hi_len = min(context - 1, int(rng.integers(970_000, 1_040_000)))
    tol = int(rng.choice([64, 256, 1024]))
    leaked: list[int] = []
    for tries in (1, 3, 3):
        # After a first pass the attacker knows a leak proves "over" while a normal answer may
        # only mean another node: it asks up to three times before calling a length "under".
        a, b = lo_len, hi_len
        while b - a > tol:
            mid = (a + b) // 2
            answered = 0
            while answered < tries:
                r = p.send(t, mid, PROBE)
                if r is None:
                    return
                outcome, t = r
                t += p.pause(0.5, 3)
                if outcome == VICTIM:
                    break
                answered += outcome == OK  # a refusal says nothing: ask again
            if outcome == VICTIM:
                b = mid
                leaked.append(mid)
            else:
                a = mid
        t += p.pause(300, 3600)
    if leaked:
        _harvest(p, t, min(leaked), 300, int(rng.integers(20, 61)), (20, 600), 8)


def _harvest(p, t, length, spread, n, gap_s, give_up) -> None:
    """Runs of 5-15 requests just above ``length``, hours apart, until ``n`` are sent or the
    last ``give_up`` answers in a row leaked nothing."""
    rng = p.rng
    misses = 0
    while n > 0:
        run = min(n, int(rng.integers(5, 16)))
        for _ in range(run):
            r = p.send(t, length + int(rng.integers(0, spread + 1)), EXPLOIT)
            if r is None:
                return
            outcome, done = r
            misses = 0 if outcome == VICTIM else misses + 1
            if misses >= give_up:
                return
            t = done + p.pause(*gap_s)
        n -= run
        t += p.pause(2 * 3600, 20 * 3600)


def _fire(p: _Prober, t: int, lengths) -> tuple[list[tuple[int, int]], int] | None:
    """Send ``lengths`` a few seconds apart without waiting; (length, outcome) pairs and the
    instant the last answer is back."""
    seen, last = [], t
    for length in lengths:
        r = p.send(t, length, PROBE)
        if r is None:
            return None
        seen.append((length, r[0]))
        last = max(last, r[1])
        t += p.pause(1, 4)
    return seen, last


def _sweep(p: _Prober, lo: int, hi: int, limit: int, context: int) -> None:
    rng = p.rng
    t = lo + round(rng.uniform(0, 0.4) * (hi - lo))
    for _ in range(2):
        start = int(rng.integers(56, 65)) * 10_000
        step = int(rng.choice([5_000, 8_000, 10_000]))
        coarse = range(start, min(context - 1, start + 400_000) + 1, step)
        r = _fire(p, t, coarse)
        if r is None:
            return
        seen, t = r
        t += p.pause(120, 1200)
        leaks = [length for length, outcome in seen if outcome == VICTIM]
        if leaks:
            first = min(leaks)
            fine_step = int(rng.choice([128, 256, 512]))
            r = _fire(p, t, range(first - step + fine_step, first, fine_step))
            if r is None:
                return
            seen, t = r
            t += p.pause(60, 600)
            found = min([length for length, outcome in seen if outcome == VICTIM] + [first])
            _harvest(p, t, found, 100, int(rng.integers(10, 26)), (30, 300), 8)
        t = max(t, lo) + p.pause(86_400, 2.5 * 86_400)


def _repeat(p: _Prober, lo: int, hi: int, limit: int, context: int) -> None:
    rng = p.rng
    t = lo + round(rng.uniform(0, 0.3) * (hi - lo))
    # Round lengths upward from somewhere around two-thirds of the window.
    start = int(rng.integers(60, 71)) * 10_000
    grid = [start + k * 50_000 for k in range(6)]
    found = None
    for _ in range(3):
        for length in grid[: int(rng.integers(4, 7))]:
            r = p.send(t, length, PROBE)
            if r is None:
                return
            outcome, t = r
            t += p.pause(1, 10)
            if outcome == VICTIM:
                found = length
                break
        if found is not None:
            break
        t += p.pause(3600, 6 * 3600)
    if found is None:
        return
    # The harvest: exactly ``found`` on a schedule, runs of hours with a few minutes between
    # requests, until enough is collected or the leak has stopped for good.
    n, misses = int(rng.integers(150, 401)), 0
    t += p.pause(600, 3 * 3600)
    while n > 0:
        run_end = t + p.pause(3600, 4 * 3600)
        while t < run_end and n > 0:
            r = p.send(t, found, EXPLOIT)
            if r is None:
                return
            outcome, done = r
            n -= 1
            misses = 0 if outcome == VICTIM else misses + 1
            if misses >= 10:
                return
            t = max(t + p.pause(120, 720), done + US)
        t += p.pause(3 * 3600, 12 * 3600)


def _slow(p: _Prober, lo: int, hi: int, limit: int, context: int) -> None:
    rng = p.rng
    n = int(rng.integers(10, 21))
    slot = (hi - lo) // n
    centre = limit * rng.uniform(0.985, 1.015)
    a, b = int(centre * 0.97), int(centre * 1.03)
    used: set[int] = set()
    for k in range(n):
        t = lo + k * slot + round(rng.uniform(0.1, 0.9) * slot)
        if b - a > 2_000:
            length = (a + b) // 2 + int(rng.integers(-40, 41))
        else:
            length = b + int(rng.integers(1, 3_000))
        while length in used:  # every probe is a fresh length
            length += 1
        used.add(length)
        r = p.send(t, length, PROBE)
        if r is None:
            return
        if r[0] == VICTIM:
            b = min(b, length)
        elif r[0] == OK:
            a = max(a, length)
