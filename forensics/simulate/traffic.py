"""Who sends what, when: tenants, diurnal arrivals and token lengths (vectorised with numpy).

Length distributions are log-normal fits (mean and standard deviation of the log) to public
production traces, fitted once at development time and hard-coded so nothing here reads those
files at run time:

- ``chat``: Azure LLM inference trace 2023, conversation service (19,366 requests):
  prompt mu 6.633 sigma 0.985, completion mu 5.019 sigma 0.859.
- ``code``: the same trace, coding service (8,819 requests): prompt mu 6.999 sigma 1.360,
  completion mu 2.788 sigma 0.847.
- ``rag``: Mooncake FAST'25 conversation trace (12,031 requests): prompt mu 8.737 sigma 1.199,
  completion mu 5.336 sigma 1.358.
- ``agentic``: the Mooncake shape with prompts three times longer (mu + ln 3), an assumption for
  tool-heavy coding agents, plus a long-context tail of 650K-1.06M token prompts (whole
  repositories pasted into the context) that crosses the undersized prefill threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from forensics.simulate.config import US, SimConfig

if TYPE_CHECKING:
    import numpy as np

PROFILES = ("chat", "code", "rag", "agentic")
PROMPT_LOGN = {
    "chat": (6.633, 0.985),
    "code": (6.999, 1.360),
    "rag": (8.737, 1.199),
    "agentic": (9.836, 1.199),
}
COMPLETION_LOGN = {
    "chat": (5.019, 0.859),
    "code": (2.788, 0.847),
    "rag": (5.336, 1.358),
    "agentic": (5.336, 1.358),
}
# Ordinary (non-tail) prompts stay below this so the long tail is controlled by one knob.
ORDINARY_PROMPT_CAP = 262_144
LONG_PROMPT_RANGE = (650_000, 1_060_000)

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

    @property
    def researcher(self) -> int:
        return len(self.ids) - 2

    @property
    def internal(self) -> int:
        return len(self.ids) - 1


@dataclass
class Traffic:
    """Per-request arrays (unsorted until ``sort``), all integers."""

    received_us: np.ndarray
    tenant: np.ndarray
    prompt: np.ndarray
    completion: np.ndarray  # tokens the client asked the model to generate (before pool clip)
    max_tokens: np.ndarray
    cached: np.ndarray
    key_index: np.ndarray
    ip: np.ndarray


def _ip(a: int, b: int, c: int, d: int) -> int:
    return (a << 24) | (b << 16) | (c << 8) | d


def make_tenants(cfg: SimConfig, rng: np.random.Generator) -> tuple[Tenants, np.ndarray]:
    """Customer tenants with skewed weights, plus the researcher and the internal tenant.

    Returns:
        The tenants and the customers' traffic weights (summing to 1).
    """
    import numpy as np

    n = cfg.tenants
    # Zipf-like weights over a random order: a few heavy tenants and a long tail.
    weights = 1.0 / np.arange(1, n + 1) ** 1.1
    weights /= weights.sum()
    n_agentic = max(2, round(cfg.agentic_share * n))
    profiles = rng.choice(np.array(PROFILES[:3]), size=n, p=[0.45, 0.30, 0.25]).tolist()
    # One heavy customer is an agentic-coding shop (it trips the bug innocently and often);
    # the other agentic tenants come from the tail.
    heavy = int(rng.integers(1, min(6, n)))
    tail = rng.choice(np.arange(8, n) if n > 8 else np.arange(n), size=n_agentic - 1, replace=False)
    for i in [heavy, *tail.tolist()]:
        profiles[i] = "agentic"

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
    ids += [RESEARCHER_ID, INTERNAL_ID]
    names += ["Independent security researcher (bug bounty)", "Internal serving canary"]
    contacts += ["bounty-reports@platform.example.com", "serving-oncall@platform.example.com"]
    profiles += ["researcher", "internal"]
    keys += [[RESEARCHER_KEY], [INTERNAL_KEY]]
    uas += [RESEARCHER_UA, INTERNAL_UA]
    bases += [_ip(203, 0, 113, 0), _ip(10, 20, 0, 0)]
    spans += [250, 4000]
    maxt += [256, 128]
    tenants = Tenants(ids, names, contacts, profiles, keys, uas, bases, spans, maxt)
    return tenants, weights


def _diurnal_times(cfg: SimConfig, n: int, rng: np.random.Generator) -> np.ndarray:
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


def _lognormal(rng, mu, sigma, size):
    import numpy as np

    return np.exp(rng.normal(mu, sigma, size))


def customer_traffic(
    cfg: SimConfig, tenants: Tenants, weights: np.ndarray, n: int, rng: np.random.Generator
) -> Traffic:
    """``n`` customer requests: diurnal arrivals, tenants by weight, profile-shaped lengths."""
    import numpy as np

    n_cust = len(weights)
    received = _diurnal_times(cfg, n, rng)
    tenant = rng.choice(n_cust, size=n, p=weights).astype(np.int64)
    profile_of = np.array([PROFILES.index(p) for p in tenants.profiles[:n_cust]])
    prof = profile_of[tenant]
    prompt = np.empty(n, dtype=np.float64)
    completion = np.empty(n, dtype=np.float64)
    for k, name in enumerate(PROFILES):
        sel = prof == k
        m = int(sel.sum())
        prompt[sel] = _lognormal(rng, *PROMPT_LOGN[name], m)
        completion[sel] = _lognormal(rng, *COMPLETION_LOGN[name], m)
    prompt = np.clip(np.round(prompt), 1, ORDINARY_PROMPT_CAP).astype(np.int64)
    completion = np.clip(np.round(completion), 1, None).astype(np.int64)

    # The long-context tail: agentic tenants share it in proportion to their traffic.
    agentic = prof == PROFILES.index("agentic")
    share = float(weights[profile_of == PROFILES.index("agentic")].sum())
    p_long = min(0.5, cfg.long_prompt_fraction / share) if share > 0 else 0.0
    is_long = agentic & (rng.random(n) < p_long)
    lo, hi = LONG_PROMPT_RANGE
    prompt[is_long] = rng.integers(lo, hi, size=int(is_long.sum()))

    max_tokens = np.array(tenants.max_tokens[:n_cust], dtype=np.int64)[tenant]
    # Prefix-cache hits on prefill for shorter prompts (repeated system prompts, multi-turn
    # chat); at most half the prompt so TTFT stays roughly proportional to prompt length.
    hit = (rng.random(n) < 0.35) & (prompt >= 256) & (prompt < ORDINARY_PROMPT_CAP)
    frac = rng.uniform(0.1, 0.5, n)
    cached = np.where(hit, (prompt * frac).astype(np.int64) // 64 * 64, 0)
    n_keys = np.array([len(k) for k in tenants.keys[:n_cust]])
    key_index = (rng.random(n) * n_keys[tenant]).astype(np.int64)
    bases = np.array(tenants.ip_bases[:n_cust], dtype=np.int64)
    spans = np.array(tenants.ip_span[:n_cust], dtype=np.int64)
    ip = bases[tenant] + 10 + (rng.random(n) * spans[tenant]).astype(np.int64)
    return Traffic(received, tenant, prompt, completion, max_tokens, cached, key_index, ip)


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
    return Traffic(
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
    return Traffic(
        received.astype(np.int64),
        np.full(n, tid, dtype=np.int64),
        prompt.astype(np.int64),
        completion.astype(np.int64),
        max_tokens,
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        ip,
    )


def concat(parts: list[Traffic]) -> Traffic:
    """All requests in one set of arrays, ordered by arrival."""
    import numpy as np

    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in Traffic.__annotations__}
    order = np.argsort(cols["received_us"], kind="stable")
    return Traffic(**{f: v[order] for f, v in cols.items()})
