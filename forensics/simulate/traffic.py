"""Who sends what, when: tenants, diurnal arrivals and token lengths.

Short-prompt customers send independent requests, vectorised with numpy. Their length
distributions are log-normal fits (mean and standard deviation of the log) to public
production traces, fitted once at development time and hard-coded so nothing here reads those
files at run time:

- ``chat``: Azure LLM inference trace 2023, conversation service (19,366 requests):
  prompt mu 6.633 sigma 0.985, completion mu 5.019 sigma 0.859.
- ``code``: the same trace, coding service (8,819 requests): prompt mu 6.999 sigma 1.360,
  completion mu 2.788 sigma 0.847.
- ``rag``: Mooncake FAST'25 conversation trace (12,031 requests): prompt mu 8.737 sigma 1.199,
  completion mu 5.336 sigma 1.358.

Long-context customers send sessions whose next prompt holds the previous one plus the answer
the client received, so they are generated a request at a time by ``forensics.simulate.sessions``
(``longctx``: real conversations replayed from the Mooncake trace's turn structure, shipped as
``data/mooncake_sessions.csv.gz``, over a large document; ``agentic``: coding agents growing by
tool results and compacting near the window; ``docqa``: questions over a few fixed documents).
The long-context share of customer requests is a knob (``long_context_fraction``), not a fit.
Deliberate probers (``forensics.simulate.probers``) are ordinary-looking customer tenants.

Arrivals follow a day and week cycle. The conversation service's trace arrives much as a
Poisson process does (gaps' coefficient of variation 1.09), so ``chat`` and ``rag`` requests
arrive independently; the coding service's does not (13.2: 17 % of its gaps are under a
millisecond, up to 67 requests in one second), so ``code`` requests arrive in bursts fitted to
it (``BURST_SIZES``, ``BURST_GAP_LOGN``). The trace names no user, so which client a burst
came from is ours to choose: one tenant per burst (an editor's or a tool's parallel calls),
the harder case for any rule that counts a tenant's requests in a window.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from forensics.errors import ForensicsError
from forensics.simulate.config import US, SimConfig

if TYPE_CHECKING:
    import numpy as np

SHORT_PROFILES = ("chat", "code", "rag")
LONG_PROFILES = ("agentic", "longctx", "docqa")
PROFILES = SHORT_PROFILES + LONG_PROFILES
PROMPT_LOGN = {
    "chat": (6.633, 0.985),
    "code": (6.999, 1.360),
    "rag": (8.737, 1.199),
}
COMPLETION_LOGN = {
    "chat": (5.019, 0.859),
    "code": (2.788, 0.847),
    "rag": (5.336, 1.358),
}
# Bursts of the coding service (Azure 2023 code trace, requests less than 100 ms apart grouped):
# (smallest, largest, share of bursts). 41 % of its bursts are one request, and the bursts of
# five or more hold 54 % of its requests.
BURST_SIZES = (
    (1, 1, 0.4146),
    (2, 2, 0.2218),
    (3, 3, 0.1247),
    (4, 4, 0.0703),
    (5, 8, 0.1020),
    (9, 16, 0.0499),
    (17, 32, 0.0127),
    (33, 64, 0.0026),
    (65, 188, 0.0014),
)
# The gaps within those bursts (µs): log-normal mu and sigma of their log, at most 100 ms
# (median 5.2 ms, a tenth under 0.13 ms).
BURST_GAP_LOGN = (8.62, 2.523)
BURST_GAP_MAX_US = 100_000
# Short prompts stay below this; only the long-context profiles and probers go beyond it.
ORDINARY_PROMPT_CAP = 262_144
# Prefix-cache hits on prefill: repeated system prompts and multi-turn chat. Only prompts below
# the cap hit, and for at most half the prompt, so TTFT stays roughly proportional to length.
CACHE_HIT_RATE = 0.35
CACHE_HIT_FRACTION = (0.1, 0.5)
# A session's later turn (a conversation's next question, an agent's next step) repeats the
# context before it, which the prefill's prefix cache still holds this often (routed back to the
# node that has it, not yet evicted): then only what the turn added is computed, whatever the
# prompt's length. In a real conversation trace (Mooncake), a third of the prompts of 32K tokens
# or more reused at least nine tenths of themselves.
SESSION_CACHE_HIT_RATE = 0.75

# Tenant index conventions: customers first, then the two special tenants.
RESEARCHER_ID = "acct_researcher"
RESEARCHER_KEY = "key_researcher_01"
RESEARCHER_CIDR = "203.0.113.0/24"
RESEARCHER_UA = "python-httpx/0.27.2"
INTERNAL_ID = "acct_internal"
INTERNAL_KEY = "key_internal_canary"
INTERNAL_CIDR = "10.20.0.0/16"
INTERNAL_UA = "kvf-canary/1.0"

CUSTOMER_UAS = (
    "openai-python/1.54.3",
    "openai-node/4.71.1",
    "python-requests/2.32.3",
    "curl/8.5.0",
    "litellm/1.52.0",
    "langchain-openai/0.2.9",
    "Go-http-client/2.0",
)
_ADJ = (
    "Amber",
    "Blue",
    "Cobalt",
    "Delta",
    "Ember",
    "Fjord",
    "Granite",
    "Harbor",
    "Indigo",
    "Juniper",
    "Keystone",
    "Lumen",
    "Maple",
    "Nimbus",
    "Orbit",
    "Pioneer",
    "Quartz",
    "Riverbend",
    "Summit",
    "Tidal",
    "Umbra",
    "Vector",
    "Willow",
    "Xenon",
    "Yarrow",
    "Zenith",
)
_NOUN = (
    "Analytics",
    "Bank",
    "Bio",
    "Cloud",
    "Commerce",
    "Dynamics",
    "Energy",
    "Foods",
    "Freight",
    "Games",
    "Health",
    "Insurance",
    "Labs",
    "Legal",
    "Media",
    "Mobility",
    "Networks",
    "Pharma",
    "Retail",
    "Robotics",
    "Security",
    "Software",
    "Studios",
    "Travel",
)


@dataclass
class Tenants:
    """Tenant-level attributes, index-aligned; customers first, then researcher, internal."""

    ids: list[str]
    names: list[str]
    contacts: list[str]
    profiles: list[str]
    keys: list[list[str]]  # api key ids per tenant
    uas: list[str]
    ip_bases: list[int]  # IPv4 network base as an integer (a /24 for customers)
    ip_span: list[int]  # number of host addresses the tenant's clients use
    max_tokens: list[int]
    strategies: list[str] = field(default_factory=list)  # prober strategy, "" for none

    @property
    def researcher(self) -> int:
        return len(self.ids) - 2

    @property
    def internal(self) -> int:
        return len(self.ids) - 1

    def strategy(self, i: int) -> str:
        return self.strategies[i] if i < len(self.strategies) else ""


@dataclass
class Traffic:
    """Per-request arrays (unsorted until ``concat``), all integers.

    The fields after ``ip`` describe clients that wait for each answer (sessions, probers); the
    rest of the traffic carries the defaults (-1, or 0 for ``added`` and ``phase``).
    """

    received_us: np.ndarray
    tenant: np.ndarray
    prompt: np.ndarray
    completion: np.ndarray  # tokens the client asked the model to generate (before pool clip)
    max_tokens: np.ndarray
    cached: np.ndarray
    key_index: np.ndarray
    ip: np.ndarray
    route_prefill: np.ndarray  # prefill node the request was sent to, -1: the fleet routes it
    route_decode: np.ndarray  # decode node likewise
    expect_outcome: np.ndarray  # fleet outcome the client saw, -1 when not simulated here
    expect_completion: np.ndarray  # completion tokens it received, -1 likewise
    session: np.ndarray  # session number, -1 outside sessions
    turn: np.ndarray  # turn within the session
    parent: np.ndarray  # turn whose prompt and answer this prompt continues, -1 for none
    added: np.ndarray  # tokens added after the parent's prompt and answer
    attempt: np.ndarray  # 1, or 2.. for a resend after a refusal
    phase: np.ndarray  # prober requests: 1 probe, 2 exploitation; 0 for everything else


# The fields of clients that do not react to answers: none of them applies.
_NOT_REACTIVE = {"added": 0, "attempt": 1, "phase": 0}


def plain(received, tenant, prompt, completion, max_tokens, cached, key_index, ip) -> Traffic:
    """Traffic of clients that do not react to answers (the later fields at their defaults)."""
    import numpy as np

    n = len(received)
    extra = {
        f.name: np.full(n, _NOT_REACTIVE.get(f.name, -1), dtype=np.int64)
        for f in fields(Traffic)[8:]
    }
    return Traffic(
        np.asarray(received, dtype=np.int64),
        np.asarray(tenant, dtype=np.int64),
        np.asarray(prompt, dtype=np.int64),
        np.asarray(completion, dtype=np.int64),
        np.asarray(max_tokens, dtype=np.int64),
        np.asarray(cached, dtype=np.int64),
        np.asarray(key_index, dtype=np.int64),
        np.asarray(ip, dtype=np.int64),
        **extra,
    )


def _ip(a: int, b: int, c: int, d: int) -> int:
    return (a << 24) | (b << 16) | (c << 8) | d


def make_tenants(cfg: SimConfig, rng: np.random.Generator) -> tuple[Tenants, np.ndarray]:
    """Customer tenants with skewed weights, plus the researcher and the internal tenant.

    Profiles: most customers send short prompts (chat, code, rag). One heavy customer runs
    coding agents and one heavy customer holds long-document conversations (both trip the bug
    innocently and often); a few more of each, and the document-QA tenants, come from the
    tail. Prober strategies go to short-prompt customers last, so adding probers changes no
    tenant's id or profile.

    Returns:
        The tenants and the customers' traffic weights (summing to 1).
    """
    import numpy as np

    n = cfg.tenants
    # Zipf-like weights over a random order: a few heavy tenants and a long tail.
    weights = 1.0 / np.arange(1, n + 1) ** 1.1
    weights /= weights.sum()
    profiles = rng.choice(np.array(SHORT_PROFILES), size=n, p=[0.45, 0.30, 0.25]).tolist()
    n_agentic = round(cfg.agentic_share * n)
    n_longctx = round(cfg.longctx_share * n)
    # The heavy agentic and long-context customers sit among the heaviest few; the others, and
    # the document-QA tenants, in the tail. Index 0, the heaviest, stays a short-prompt one.
    heavy = rng.permutation(np.arange(1, min(6, n))).tolist()
    heavy_picks = {"agentic": heavy[:1] if n_agentic else [], "longctx": []}
    if n_longctx and len(heavy) > 1:
        heavy_picks["longctx"] = heavy[1:2]
    taken = set(heavy_picks["agentic"] + heavy_picks["longctx"])
    tail = rng.permutation(np.arange(8, n) if n > 16 else np.arange(1, n)).tolist()
    tail = [i for i in tail if i not in taken]
    for profile, count in (
        ("agentic", n_agentic),
        ("longctx", n_longctx),
        ("docqa", cfg.docqa_tenants),
    ):
        picks = heavy_picks.get(profile, [])
        k = max(0, count - len(picks))
        picks, tail = picks + tail[:k], tail[k:]
        for i in picks:
            profiles[i] = profile

    used: set[str] = set()
    ids, names, contacts, keys, uas, bases, spans, maxt = [], [], [], [], [], [], [], []
    for i in range(n):
        while True:
            tid = f"acct_{int(rng.integers(0, 16**6)):06x}"
            if tid not in used:
                used.add(tid)
                break
        adj, noun = _ADJ[int(rng.integers(len(_ADJ)))], _NOUN[int(rng.integers(len(_NOUN)))]
        name = f"{adj} {noun} {'Inc.' if i % 3 == 0 else 'Ltd' if i % 3 == 1 else 'GmbH'}"
        slug = f"{adj}{noun}".lower()
        ids.append(tid)
        names.append(name)
        contacts.append(f"security@{slug}{i}.example.com")
        nk = 1 + int(rng.integers(0, 3))
        keys.append([f"key_{int(rng.integers(0, 16**10)):010x}" for _ in range(nk)])
        uas.append(CUSTOMER_UAS[int(rng.integers(len(CUSTOMER_UAS)))])
        # Customers' clients sit in the 198.18.0.0/15 benchmarking range, one /24 each.
        bases.append(_ip(198, 18 + (i >> 8), i & 255, 0))
        spans.append(int(rng.integers(1, 40)))
        maxt.append(int(rng.choice([1024, 2048, 4096, 8192])) if profiles[i] != "code" else 512)
    strategies = _assign_probers(cfg, profiles, rng)
    ids += [RESEARCHER_ID, INTERNAL_ID]
    names += ["Independent security researcher (bug bounty)", "Internal serving canary"]
    contacts += ["bounty-reports@platform.example.com", "serving-oncall@platform.example.com"]
    profiles += ["researcher", "internal"]
    keys += [[RESEARCHER_KEY], [INTERNAL_KEY]]
    uas += [RESEARCHER_UA, INTERNAL_UA]
    bases += [_ip(203, 0, 113, 0), _ip(10, 20, 0, 0)]
    spans += [250, 4000]
    maxt += [256, 128]
    strategies += ["", ""]
    tenants = Tenants(ids, names, contacts, profiles, keys, uas, bases, spans, maxt, strategies)
    return tenants, weights


def _assign_probers(cfg: SimConfig, profiles: list[str], rng) -> list[str]:
    """A short-prompt customer per prober: small tail accounts, except ``slow``, which hides in
    a mid-sized customer's ordinary traffic. Drawn after everything else from the tenant
    stream, so the other tenants are the same with or without probers."""
    n = len(profiles)
    strategies = [""] * n
    short = [i for i in range(n) if profiles[i] in SHORT_PROFILES]
    order = rng.permutation(len(short)).tolist()
    tail = [short[k] for k in order if short[k] >= 8] or [short[k] for k in order]
    middle = [short[k] for k in order if 2 <= short[k] < 16] or tail
    for name in cfg.probers:
        pool = middle if name == "slow" else tail
        free = [i for i in pool if not strategies[i]] or [i for i in short if not strategies[i]]
        if not free:
            raise ForensicsError("simulate: more probers than short-prompt customer tenants")
        strategies[free[0]] = name
    return strategies


def long_budgets(
    cfg: SimConfig, tenants: Tenants, weights: np.ndarray, n_cust: int
) -> dict[int, int]:
    """Requests each long-context tenant sends: ``long_context_fraction`` of the customer
    requests, split by the tenants' traffic weights (so the heavy ones dominate).

    >>> from forensics.simulate.config import SimConfig
    >>> import numpy as np
    >>> t = Tenants(*[[None] * 5 for _ in range(9)])
    >>> t.profiles[:3] = ["chat", "longctx", "agentic"]
    >>> long_budgets(SimConfig(long_context_fraction=0.1), t, np.array([0.5, 0.3, 0.2]), 1000)
    {1: 60, 2: 40}
    """
    n_c = len(weights)
    long_idx = [i for i in range(n_c) if tenants.profiles[i] in LONG_PROFILES]
    total = round(cfg.long_context_fraction * n_cust)
    w = sum(float(weights[i]) for i in long_idx)
    if not long_idx or total <= 0 or w <= 0:
        return {}
    out, left = {}, total
    for k, i in enumerate(long_idx):
        share = left if k == len(long_idx) - 1 else round(total * float(weights[i]) / w)
        share = min(share, left)
        out[i] = share
        left -= share
    return out


def diurnal_times(cfg: SimConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival instants (µs) from a day/week-modulated rate, by inverse CDF on a grid."""
    import numpy as np

    start_us = cfg.us(cfg.start)
    minutes = int(cfg.days * 1440)
    grid = np.arange(minutes + 1, dtype=np.float64)  # minute marks from the start
    hour = (cfg.start.hour + cfg.start.minute / 60 + grid / 60) % 24
    weekday = (cfg.start.weekday() + (cfg.start.hour * 60 + grid) // 1440) % 7
    # Peak mid-afternoon UTC (Europe and US East overlap), trough at night, quieter weekends.
    rate = (1.0 + 0.65 * np.cos(2 * np.pi * (hour - 15.0) / 24)) * np.where(weekday >= 5, 0.7, 1)
    cum = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2)])
    cum /= cum[-1]
    u = np.sort(rng.random(n))
    offs_min = np.interp(u, cum, grid)
    return start_us + np.round(offs_min * 60 * US).astype(np.int64)


def bursts(
    cfg: SimConfig, n: int, weights: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` arrivals in bursts (``BURST_SIZES``, gaps ``BURST_GAP_LOGN``), each burst from
    one tenant drawn by ``weights`` and starting on the day and week cycle: ``(instants µs,
    tenants)``, burst by burst."""
    import numpy as np

    lo, hi, share = (np.array(c) for c in zip(*BURST_SIZES, strict=True))
    # Enough bursts for n requests whatever the draw (a burst holds at least one).
    kind = rng.choice(len(share), size=n, p=share / share.sum())
    sizes = lo[kind] + (rng.random(n) * (hi[kind] - lo[kind] + 1)).astype(np.int64)
    count = int(np.searchsorted(np.cumsum(sizes), n)) + 1
    sizes = sizes[:count]
    sizes[-1] -= int(sizes.sum()) - n
    starts = diurnal_times(cfg, count, rng)
    who = rng.choice(len(weights), size=count, p=weights / weights.sum()).astype(np.int64)
    gaps = np.minimum(_lognormal(rng, *BURST_GAP_LOGN, n), BURST_GAP_MAX_US).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    gaps[first] = 0
    within = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[first], sizes)
    at = np.repeat(starts, sizes) + within
    return np.minimum(at, cfg.us(cfg.end) - 1), np.repeat(who, sizes)


def _lognormal(rng, mu, sigma, size):
    import numpy as np

    return np.exp(rng.normal(mu, sigma, size))


def short_weights(tenants: Tenants, weights: np.ndarray) -> np.ndarray:
    """The traffic weights of the short-prompt customers, renormalised (zero for the others)."""
    import numpy as np

    short = np.array([p in SHORT_PROFILES for p in tenants.profiles[: len(weights)]])
    w = np.where(short, weights, 0.0)
    return w / w.sum() if w.sum() > 0 else w


def cache_hits(prompt: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Prefix-cache hit tokens per prompt (whole 64-token blocks; see ``CACHE_HIT_RATE``)."""
    import numpy as np

    n = len(prompt)
    hit = (rng.random(n) < CACHE_HIT_RATE) & (prompt >= 256) & (prompt < ORDINARY_PROMPT_CAP)
    frac = rng.uniform(*CACHE_HIT_FRACTION, n)
    return np.where(hit, (prompt * frac).astype(np.int64) // 64 * 64, 0)


def customer_traffic(
    cfg: SimConfig, tenants: Tenants, weights: np.ndarray, n: int, rng: np.random.Generator
) -> Traffic:
    """``n`` short-prompt customer requests: diurnal arrivals, tenants by weight (see
    ``short_weights``), profile-shaped lengths."""
    import numpy as np

    n_cust = len(weights)
    tenant = rng.choice(n_cust, size=n, p=weights).astype(np.int64)
    profile_of = np.array(
        [SHORT_PROFILES.index(p) if p in SHORT_PROFILES else -1 for p in tenants.profiles[:n_cust]]
    )
    code = profile_of[tenant] == SHORT_PROFILES.index("code")
    received = np.empty(n, dtype=np.int64)
    received[~code] = diurnal_times(cfg, int((~code).sum()), rng)
    code_weights = np.where(profile_of == SHORT_PROFILES.index("code"), weights, 0.0)
    if code.any():
        received[code], tenant[code] = bursts(cfg, int(code.sum()), code_weights, rng)
    prof = profile_of[tenant]
    prompt = np.empty(n, dtype=np.float64)
    completion = np.empty(n, dtype=np.float64)
    for k, name in enumerate(SHORT_PROFILES):
        sel = prof == k
        m = int(sel.sum())
        prompt[sel] = _lognormal(rng, *PROMPT_LOGN[name], m)
        completion[sel] = _lognormal(rng, *COMPLETION_LOGN[name], m)
    prompt = np.clip(np.round(prompt), 1, ORDINARY_PROMPT_CAP).astype(np.int64)
    completion = np.clip(np.round(completion), 1, None).astype(np.int64)
    max_tokens = np.array(tenants.max_tokens[:n_cust], dtype=np.int64)[tenant]
    cached = cache_hits(prompt, rng)
    n_keys = np.array([len(k) for k in tenants.keys[:n_cust]])
    key_index = (rng.random(n) * n_keys[tenant]).astype(np.int64)
    bases = np.array(tenants.ip_bases[:n_cust], dtype=np.int64)
    spans = np.array(tenants.ip_span[:n_cust], dtype=np.int64)
    ip = bases[tenant] + 10 + (rng.random(n) * spans[tenant]).astype(np.int64)
    return plain(received, tenant, prompt, completion, max_tokens, cached, key_index, ip)


def researcher_traffic(
    cfg: SimConfig, tenants: Tenants, threshold: int, budget: int, rng: np.random.Generator
) -> Traffic:
    """Bursts of near-identical prompts straddling the threshold (and one the context edge).

    Args:
        threshold: the undersized prefill's max_req_input_len the researcher zeroes in on.
        budget: the most requests to generate (keeps tiny simulations customer-dominated).
    """
    import numpy as np

    bursts = max(1, min(cfg.researcher_bursts, budget // 10))
    lo, hi = cfg.us(cfg.researcher_start), cfg.us(cfg.researcher_end)
    starts = np.sort(rng.integers(lo, hi, size=bursts))
    times, prompts = [], []
    for b, t0 in enumerate(starts.tolist()):
        size = int(rng.integers(*cfg.researcher_burst_size))
        gaps = rng.integers(15 * US, 120 * US, size=size)
        times.append(t0 + np.cumsum(gaps) - gaps[0])
        if b == 3:
            # The context edge: find where the tokenizer starts refusing.
            target, offs = cfg.context_length, rng.integers(-12, 8, size=size)
        elif b == 0:
            # First burst brackets the threshold from below and above.
            target, offs = threshold, rng.integers(-60, 40, size=size)
        else:
            target, offs = threshold, rng.integers(-6, 90, size=size)
        prompts.append(target + offs)
    received = np.concatenate(times).astype(np.int64)
    prompt = np.concatenate(prompts).astype(np.int64)
    n = len(received)
    tid = tenants.researcher
    completion = rng.integers(24, 400, size=n)
    max_tokens = np.full(n, tenants.max_tokens[tid], dtype=np.int64)
    ip = tenants.ip_bases[tid] + 20 + rng.integers(0, 3, size=n)
    return plain(
        received,
        np.full(n, tid, dtype=np.int64),
        prompt,
        completion,
        max_tokens,
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        ip,
    )


def internal_traffic(
    cfg: SimConfig, tenants: Tenants, budget: int, rng: np.random.Generator
) -> Traffic:
    """Scheduled canaries: short probes on a fixed period and long-context ones twice a day."""
    import numpy as np

    start, span = cfg.us(cfg.start), int(cfg.days * 86_400 * US)
    n_short = int(min(span // int(cfg.canary_every_minutes * 60 * US), budget * 0.9))
    n_long = int(min(span // int(cfg.long_canary_every_hours * 3600 * US), max(2, budget // 10)))
    step_s = span // max(n_short, 1)
    step_l = span // max(n_long, 1)
    t_short = start + 7 * US + np.arange(n_short, dtype=np.int64) * step_s
    t_long = start + 1_800 * US + np.arange(n_long, dtype=np.int64) * step_l
    jitter = rng.integers(0, 3 * US, size=n_short + n_long)
    received = np.concatenate([t_short, t_long]) + jitter
    prompt = np.concatenate(
        [rng.integers(1_800, 2_300, size=n_short), rng.integers(700_000, 1_000_000, size=n_long)]
    )
    completion = np.concatenate(
        [rng.integers(8, 48, size=n_short), rng.integers(32, 128, size=n_long)]
    )
    n = n_short + n_long
    tid = tenants.internal
    max_tokens = np.full(n, tenants.max_tokens[tid], dtype=np.int64)
    ip = tenants.ip_bases[tid] + 256 + rng.integers(0, 8, size=n)
    return plain(
        received,
        np.full(n, tid, dtype=np.int64),
        prompt,
        completion,
        max_tokens,
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        ip,
    )


def concat(parts: list[Traffic]) -> Traffic:
    """All requests in one set of arrays, ordered by arrival."""
    import numpy as np

    names = [f.name for f in fields(Traffic)]
    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in names}
    order = np.argsort(cols["received_us"], kind="stable")
    return Traffic(**{f: v[order] for f, v in cols.items()})


class Sender:
    """Requests of clients that wait for each answer before the next one (sessions, probers).

    Each request is routed uniformly at random (the fleet's rule) when it is sent, and the
    fleet's ``ClientView`` tells the client what came back, so the next prompt can hold the
    completion actually received and a prober can read the outcome. Python per request: these
    clients are a few percent of the traffic.
    """

    def __init__(self, cfg: SimConfig, tenants: Tenants, rng: np.random.Generator):
        from forensics.simulate.fleet import ClientView

        self.view = ClientView(cfg)
        self.tenants = tenants
        self.rng = rng
        self.end_us = cfg.us(cfg.end)
        self.count: dict[int, int] = {}
        self.cols: dict[str, list[int]] = {f.name: [] for f in fields(Traffic)}

    def client(self, tenant: int) -> tuple[int, int]:
        """An API key index and a client address of the tenant (one user or machine)."""
        u, v = self.rng.random(2).tolist()
        key = int(u * len(self.tenants.keys[tenant]))
        ip = self.tenants.ip_bases[tenant] + 10 + int(v * self.tenants.ip_span[tenant])
        return key, ip

    def send(
        self,
        tenant: int,
        t_us: int,
        prompt: int,
        completion: int,
        max_tokens: int,
        client: tuple[int, int],
        *,
        session: int = -1,
        turn: int = -1,
        parent: int = -1,
        added: int = 0,
        attempt: int = 1,
        phase: int = 0,
    ) -> tuple[int, int, int, int] | None:
        """Send one request; None if ``t_us`` is past the simulated window.

        Returns:
            (prompt as sent, fleet outcome, completion tokens received, instant the whole
            answer is back).
        """
        if t_us >= self.end_us:
            return None
        view = self.view
        u, v = self.rng.random(2).tolist()
        prefill, decode = int(u * view.n_prefill), int(v * view.n_decode)
        prompt, outcome, got = view.answer(t_us, prompt, prefill, decode, completion, max_tokens)
        cached = 0
        if parent >= 0 and prompt - added >= 64:
            if self.rng.random() < SESSION_CACHE_HIT_RATE:
                cached = (prompt - added) // 64 * 64
        elif 256 <= prompt < ORDINARY_PROMPT_CAP and self.rng.random() < CACHE_HIT_RATE:
            cached = int(prompt * self.rng.uniform(*CACHE_HIT_FRACTION)) // 64 * 64
        c = self.cols
        for name, value in (
            ("received_us", t_us),
            ("tenant", tenant),
            ("prompt", prompt),
            ("completion", completion),
            ("max_tokens", max_tokens),
            ("cached", cached),
            ("key_index", client[0]),
            ("ip", client[1]),
            ("route_prefill", prefill),
            ("route_decode", decode),
            ("expect_outcome", outcome),
            ("expect_completion", got),
            ("session", session),
            ("turn", turn),
            ("parent", parent),
            ("added", added),
            ("attempt", attempt),
            ("phase", phase),
        ):
            c[name].append(value)
        self.count[tenant] = self.count.get(tenant, 0) + 1
        done = t_us + round(view.wait_s(prompt, cached, got, outcome) * US)
        return prompt, outcome, got, done

    def traffic(self) -> Traffic:
        import numpy as np

        return Traffic(**{k: np.array(v, dtype=np.int64) for k, v in self.cols.items()})
