"""The serving fleet: routing, which code path each request takes, and how long each leg lasts.

Outcomes follow the engine exactly (see docs/architecture.md, section 1):

- ``prompt >= context_length``: the tokenizer refuses it, HTTP 400, no engine leg.
- ``threshold <= prompt`` on a patched engine: prefill retires it at intake, HTTP 400, nothing
  is allocated on decode.
- ``prompt > decode pool``: decode refuses it at preallocation, HTTP 400, nothing allocated.
- ``threshold <= prompt`` before the patch: prefill logs the rejection but only marks it
  pending, runs a 1-token placeholder and ships one page; decode reserved the full prompt and
  answers from stale pages: HTTP 200 (the exposure).
- anything else: a normal request.

``threshold`` is the prefill node's ``max_req_input_len`` in force at arrival.

``ClientView`` is the same rule for one request at a time, as a client that waits for each
answer sees it (a session's next prompt holds the completion it actually received; a prober
reads the outcome); ``simulate_case`` checks that it agrees with ``plan`` on every such request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from forensics.simulate.config import US, SimConfig, max_req_input_len

if TYPE_CHECKING:
    import numpy as np

    from forensics.simulate.traffic import Traffic

OK, VICTIM, TOKENIZER_400, PREFILL_400, DECODE_400 = range(5)

# Prefill cost model: linear (MLP/MoE) plus quadratic (attention) terms, tuned so a 1M-token
# prompt takes a few minutes and a 1K-token prompt tens of milliseconds.
PREFILL_FIXED_S = 0.020
PREFILL_LINEAR_S = 5e-5
PREFILL_QUADRATIC_S = 1.5e-10
# KV transfer: ~70 KB of KV per token over ~20 GB/s RDMA.
TRANSFER_FIXED_S = 0.002
TRANSFER_PER_TOKEN_S = 3.5e-6
# Decode step time grows with the context attended.
TPOT_FIXED_S = 0.018
TPOT_PER_TOKEN_S = 2e-8


def prefill_nodes(cfg: SimConfig) -> list[str]:
    return [f"prefill-{i}" for i in range(len(cfg.prefill_pools))]


def decode_nodes(cfg: SimConfig) -> list[str]:
    return [f"decode-{i}" for i in range(len(cfg.decode_pools))]


@dataclass
class Plan:
    """Per-request routing, outcome and durations (µs), index-aligned with the traffic."""

    prefill: np.ndarray
    decode: np.ndarray
    room: np.ndarray  # bootstrap_room, 63-bit
    dp_rank: np.ndarray
    threshold: np.ndarray  # max_req_input_len in force on the prefill node at arrival
    decode_pool: np.ndarray  # per-rank pool of the decode node
    outcome: np.ndarray
    completion: np.ndarray  # tokens actually generated (0 unless the request allocated)
    finish_length: np.ndarray  # bool: generation stopped at max_tokens or the pool
    dispatch: np.ndarray  # received -> prefill leg start
    handshake: np.ndarray  # prefill leg start -> decode preallocation wanted
    to_first_token: np.ndarray  # decode allocation -> first token
    prefill_done: np.ndarray  # decode allocation -> prefill released its KV (transfer done)
    hold: np.ndarray  # decode allocation -> decode free
    reply: np.ndarray  # decode free (or rejection) -> response completed at the client


def plan(cfg: SimConfig, tr: Traffic, rng: np.random.Generator) -> Plan:
    """Route every request and decide its code path and leg durations."""
    import numpy as np

    n = len(tr.received_us)
    n_pre, n_dec = len(cfg.prefill_pools), len(cfg.decode_pools)
    prefill = rng.integers(0, n_pre, size=n)
    decode = rng.integers(0, n_dec, size=n)
    # Clients that react to answers (sessions, probers) drew their uniform route when they sent
    # the request, so they could see its outcome; everyone else is routed here.
    prefill = np.where(tr.route_prefill >= 0, tr.route_prefill, prefill)
    decode = np.where(tr.route_decode >= 0, tr.route_decode, decode)
    room = rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)
    dp_sizes = np.array(cfg.decode_dp_sizes, dtype=np.int64)
    dp_rank = room % dp_sizes[decode]

    thr_before = np.array([max_req_input_len(p, cfg.context_length) for p in cfg.prefill_pools])
    thr_after = np.array(
        [max_req_input_len(p, cfg.context_length) for p in cfg.prefill_pools_after]
    )
    changed = tr.received_us >= cfg.us(cfg.config_change_at)
    threshold = np.where(changed, thr_after[prefill], thr_before[prefill])
    decode_pool = np.array(cfg.decode_pools, dtype=np.int64)[decode]
    patched = tr.received_us >= cfg.us(cfg.patch_at)

    prompt = tr.prompt
    # A prompt of exactly the decode pool passes decode's "> pool" gate but leaves no room for
    # a generated token; nudge those (a measure-zero case) one token down.
    prompt[prompt == decode_pool] -= 1

    outcome = np.full(n, OK, dtype=np.int8)
    over = prompt >= threshold
    too_long = prompt >= cfg.context_length
    outcome[over & ~too_long] = VICTIM
    outcome[over & ~too_long & patched] = PREFILL_400
    outcome[~too_long & (outcome != PREFILL_400) & (prompt > decode_pool)] = DECODE_400
    outcome[too_long] = TOKENIZER_400
    allocates = (outcome == OK) | (outcome == VICTIM)

    ps = cfg.page_size
    room_tokens = (decode_pool // ps) * ps - prompt
    wanted = np.minimum(tr.completion, tr.max_tokens)
    completion = np.where(allocates, np.minimum(wanted, room_tokens), 0)
    finish_length = allocates & ((completion < tr.completion) | (completion >= tr.max_tokens))

    # Durations in seconds, then µs. Victims prefill and ship one token.
    victim = outcome == VICTIM
    computed = np.where(victim, 1, prompt - tr.cached).astype(np.float64)
    sent = np.where(victim, 1, prompt).astype(np.float64)
    jitter = rng.uniform(0.9, 1.15, n)
    prefill_s = (
        PREFILL_FIXED_S + PREFILL_LINEAR_S * computed + PREFILL_QUADRATIC_S * computed**2
    ) * jitter
    # Queueing in the prefill waiting queue: usually short, sometimes behind a long prompt.
    queue_s = rng.exponential(0.04, n) + np.where(
        rng.random(n) < 0.05, rng.exponential(2.0, n), 0.0
    )
    pages_sent = np.ceil(sent / ps) * ps
    transfer_s = TRANSFER_FIXED_S + TRANSFER_PER_TOKEN_S * pages_sent * rng.uniform(0.8, 1.3, n)
    tpot_s = (TPOT_FIXED_S + TPOT_PER_TOKEN_S * prompt) * rng.uniform(0.85, 1.2, n)

    def us(x):
        return np.maximum(np.round(x * US), 1).astype(np.int64)

    dispatch = us(0.001 + 4e-7 * prompt + rng.exponential(0.002, n))
    handshake = us(0.0005 + rng.exponential(0.001, n))
    prefill_done = us(queue_s + prefill_s + transfer_s)
    to_first_token = prefill_done + us(tpot_s)
    hold = prefill_done + us(tpot_s * np.maximum(completion, 1) + 0.0005)
    reply = us(0.001 + rng.exponential(0.001, n))
    return Plan(
        prefill,
        decode,
        room,
        dp_rank,
        threshold,
        decode_pool,
        outcome,
        completion,
        finish_length,
        dispatch,
        handshake,
        to_first_token,
        prefill_done,
        hold,
        reply,
    )


class ClientView:
    """One request's code path and completion on a known route, by ``plan``'s rule.

    A client that waits for each answer (a conversation, an agent, a prober) learns from it: an
    over-limit prompt on a vulnerable prefill node answers at once with foreign content; a
    refusal returns HTTP 400 and no tokens. Plain Python on scalars (it runs once per such
    request while the traffic is generated).
    """

    def __init__(self, cfg: SimConfig):
        ctx = cfg.context_length
        self.context_length = ctx
        self.thr_before = [max_req_input_len(p, ctx) for p in cfg.prefill_pools]
        self.thr_after = [max_req_input_len(p, ctx) for p in cfg.prefill_pools_after]
        self.change_us = cfg.us(cfg.config_change_at)
        self.patch_us = cfg.us(cfg.patch_at)
        self.decode_pools = list(cfg.decode_pools)
        self.page_size = cfg.page_size
        self.n_prefill = len(cfg.prefill_pools)
        self.n_decode = len(cfg.decode_pools)

    def answer(
        self, t_us: int, prompt: int, prefill: int, decode: int, completion: int, max_tokens: int
    ) -> tuple[int, int, int]:
        """(prompt as sent, outcome, completion tokens received) for one request.

        >>> from forensics.simulate.config import SimConfig
        >>> view = ClientView(SimConfig())
        >>> t = SimConfig().us(SimConfig().start)
        >>> view.answer(t, 700_000, 0, 0, 300, 256) == (700_000, VICTIM, 256)
        True
        >>> view.answer(t, 700_000, 3, 0, 300, 256) == (700_000, OK, 256)
        True
        >>> view.answer(t, 1_048_576, 3, 0, 300, 256) == (1_048_576, TOKENIZER_400, 0)
        True
        """
        pool = self.decode_pools[decode]
        if prompt == pool:  # plan() nudges these one token down
            prompt -= 1
        thr = (self.thr_after if t_us >= self.change_us else self.thr_before)[prefill]
        if prompt >= self.context_length:
            return prompt, TOKENIZER_400, 0
        if prompt >= thr and t_us >= self.patch_us:
            return prompt, PREFILL_400, 0
        if prompt > pool:
            return prompt, DECODE_400, 0
        room = (pool // self.page_size) * self.page_size - prompt
        got = min(completion, max_tokens, room)
        return prompt, (VICTIM if prompt >= thr else OK), got

    @staticmethod
    def wait_s(prompt: int, cached: int, received: int, outcome: int) -> float:
        """How long the client waits for the whole answer, at the slow end of ``plan``'s jitter.

        Queueing is not foreseen (beyond a fraction of a second for prefill; not at all for
        decode pages, which depends on the whole fleet), so a few answers still arrive after
        the client's next request.
        """
        if outcome not in (OK, VICTIM):
            return 0.01 + 4e-7 * prompt
        victim = outcome == VICTIM
        computed = 1 if victim else prompt - cached
        sent = 1 if victim else prompt
        prefill_s = (
            PREFILL_FIXED_S + PREFILL_LINEAR_S * computed + PREFILL_QUADRATIC_S * computed**2
        ) * 1.15
        transfer_s = TRANSFER_FIXED_S + TRANSFER_PER_TOKEN_S * sent * 1.3
        tpot_s = (TPOT_FIXED_S + TPOT_PER_TOKEN_S * prompt) * 1.2
        return 0.3 + 4e-7 * prompt + prefill_s + transfer_s + tpot_s * max(received, 1)
