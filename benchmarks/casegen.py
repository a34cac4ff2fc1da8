"""Large canonical cases for the scale benchmark, generated column-wise (numpy and pyarrow).

``forensics simulate`` replays every long-context session turn by turn to keep a ground truth;
that costs about 20 s and 2 GB per million requests, too much for 16 million. This generator
keeps only what the pipeline's cost depends on, each day of traffic generated as whole
columns:

- a fleet of 64 prefill and 64 decode nodes with 4 data-parallel ranks each; 16 prefill nodes
  run the undersized pool (681,280 tokens) and 8 a medium one (917,504) until a configuration
  change, every pool is reported every 6 hours (and at the change and the patch);
- 5,000 tenants with Zipf-distributed traffic (exponent 1.1), a few API keys, client addresses
  and user agents each, plus a researcher and an internal canary (both excluded);
- prompts log-normal around 1,500 tokens, a long tail of long-context prompts (32K-650K) sent by
  one tenant in twenty, and prompts at or over the input limit (0.125 %) from the same
  tenants: on a vulnerable prefill node before the patch those are the affected responses, a
  few per decode rank;
- per request its client record, its prefill and decode legs (timed by a prefill cost model),
  the rejection logged by the prefill for an over-limit prompt, 429s without legs, 500s with
  aborted legs and tokenizer 400s for prompts past the context window;
- no decode rank holds more KV than its pool: a request whose reservation would not fit waits,
  as in SGLang's decode pre-allocation queue, and its engine work starts when pages free
  (:func:`admit`). Without that, two prompts near the window on one rank overflowed it, which
  no engine does, and the replay rightly called those ranks' logs incomplete (36 of 256 ranks
  at 8M requests, 139 at 16M, all at 100M: generator version 1).

A case is written once per size in two formats, Parquet (typed timestamps, zstd) and JSON
Lines .gz (RFC 3339 strings), one file per kind and UTC day, each with its ``case.toml``.
``GENERATOR_VERSION`` is part of the cache key: change it whenever the output changes.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

GENERATOR_VERSION = 2

START = datetime(2026, 8, 27, tzinfo=UTC)
DAYS = 14
REPORT_AT = START + timedelta(days=12, hours=14, minutes=2)
CONFIG_CHANGE_AT = START + timedelta(days=12, hours=22, minutes=30)
PATCH_AT = START + timedelta(days=13, hours=19, minutes=40)
RESEARCHER_FROM = START + timedelta(days=9)
RESEARCHER_TO = START + timedelta(days=12, hours=12)

US = 1_000_000
CONTEXT = 1_048_576
PAGE = 64
SMALL_POOL = 681_280
MEDIUM_POOL = 917_504
LARGE_POOL = 1_310_720
DECODE_POOL = 1_572_864  # per rank: holds any prompt under the context window
MODEL = "glm-5.3"
REJECTION = (
    "Input length ({} tokens) exceeds the maximum allowed length ({} tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)
RESEARCHER = "acct_researcher"
RESEARCHER_KEY = "key_researcher_01"
INTERNAL = "acct_internal"
INTERNAL_KEY = "key_internal_canary"
KINDS = ("requests", "engine_legs", "pool_snapshots", "tenants")
FORMATS = ("parquet", "jsonl")
TS_FORMAT = "%Y-%m-%dT%H:%M:%S%.6fZ"
# Outcomes of a request.
OK, VICTIM, RATE_LIMITED, SERVER_ERROR, TOKENIZER_400, PREFILL_400 = range(6)


@dataclass(frozen=True)
class Shape:
    """The fleet and traffic mix; every case of the ladder uses the same shape."""

    prefill_nodes: int = 64
    decode_nodes: int = 64
    dp_size: int = 4
    tenants: int = 5000
    zipf: float = 1.1
    long_tenant_share: float = 0.05
    long_share: float = 0.01  # prompts of 32K-650K tokens
    over_limit_share: float = 0.00125  # prompts between the smallest limit and the window
    past_window_share: float = 0.0001  # prompts the tokenizer refuses
    rate_limited_share: float = 0.004
    server_error_share: float = 0.0005
    researcher_per_million: int = 60
    internal_share: float = 0.002


# The ladder's fleet, and the small one of the CI mode: at 200,000 requests it gives each node
# and tenant about the traffic density the ladder has at 1-2M (64 nodes would sit silent for
# half an hour at night, a different workload), and a report with hundreds of notices, not
# thousands.
SHAPES = {"fleet64": Shape(), "small": Shape(prefill_nodes=8, decode_nodes=8, tenants=500)}


def us(dt: datetime) -> int:
    """An instant as integer microseconds since the epoch."""
    return int((dt - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * US


def limit(pool: int) -> int:
    """The engine's input limit for a pool: ``min(context - 1, pool - 1) - 5``."""
    return min(CONTEXT - 1, pool - 1) - 5


def prefill_pools(shape: Shape) -> tuple[list[int], list[int]]:
    """Each prefill node's pool before and after the configuration change."""
    before, after = [], []
    for i in range(shape.prefill_nodes):
        pool = SMALL_POOL if i % 8 < 2 else MEDIUM_POOL if i % 8 == 2 else LARGE_POOL
        before.append(pool)
        after.append(LARGE_POOL if pool == SMALL_POOL else pool)
    return before, after


def node_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(count)]


@dataclass
class Population:
    """Tenants and what identifies their traffic (small: built once per case)."""

    ids: list[str]
    weights: object  # numpy float array, Zipf
    long_ids: object  # numpy int array: the tenants sending long prompts
    long_weights: object
    keys: list[str]  # 4 per tenant
    key_count: object  # numpy int array: keys in use per tenant (1-4)
    ips: list[str]  # 8 per tenant
    agents: list[str]
    agent_of: object  # numpy int array


AGENTS = (
    "openai-python/1.82.0",
    "OpenAI/NodeJS 5.3.0",
    "python-httpx/0.28.1",
    "Go-http-client/2.0",
    "curl/8.11.1",
    "langchain/0.3.25",
)


def population(shape: Shape, rng) -> Population:
    import numpy as np

    n = shape.tenants
    ids = [f"acct_{h:08x}" for h in rng.choice(16**8, size=n, replace=False)]
    ids += [RESEARCHER, INTERNAL]
    rank = rng.permutation(n) + 1
    weights = 1.0 / rank.astype(np.float64) ** shape.zipf
    weights /= weights.sum()
    long_ids = np.sort(rng.choice(n, size=max(1, int(n * shape.long_tenant_share)), replace=False))
    long_weights = weights[long_ids] / weights[long_ids].sum()
    keys = [f"key_{h:010x}" for h in rng.integers(0, 16**10, size=4 * n)]
    keys += [RESEARCHER_KEY] * 4 + [INTERNAL_KEY] * 4
    key_count = np.concatenate([rng.integers(1, 5, size=n), [1, 1]])
    octets = rng.integers(1, 255, size=(n, 3))
    ips = [
        f"{100 + o[0] % 100}.{o[1]}.{o[2]}.{host}" for o in octets.tolist() for host in range(1, 9)
    ]
    ips += [f"203.0.113.{h}" for h in range(1, 9)] + [f"10.20.0.{h}" for h in range(1, 9)]
    agents = list(AGENTS) + ["kvf-canary/1.0"]
    agent_of = np.concatenate([rng.integers(0, len(AGENTS), size=n), [2, len(AGENTS)]])
    return Population(ids, weights, long_ids, long_weights, keys, key_count, ips, agents, agent_of)


def _strings(values: list[str], index, mask=None):
    """A string column taking ``values[index]`` (null where ``mask`` is set)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.take(pa.array(values, pa.string()), pa.array(index, pa.int32(), mask=mask))


def _hex_ids(rng, n: int):
    """``n`` random 32-hex-digit ids as an Arrow string column, without a Python loop."""
    import numpy as np
    import pyarrow as pa

    halves = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64).astype(">u8")
    data = halves.tobytes().hex().encode("ascii")
    offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _ts(values, mask=None):
    import pyarrow as pa

    return pa.array(values, pa.int64(), mask=mask).cast(pa.timestamp("us", tz="UTC"))


def _ints(values, mask=None):
    import pyarrow as pa

    return pa.array(values, pa.int64(), mask=mask)


def _messages(mask, prompts, limits):
    """The prefill's rejection text where ``mask`` holds, null elsewhere."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    where = np.flatnonzero(mask)
    texts = pa.array(
        [REJECTION.format(p, t) for p, t in zip(prompts[where], limits[where], strict=True)],
        pa.string(),
    )
    index = np.full(len(mask), -1, dtype=np.int32)
    index[where] = np.arange(len(where), dtype=np.int32)
    return pc.take(texts, pa.array(index, mask=index < 0))


def _legs(rid, room, role, node, started, finished, **cols):
    """One role's ``engine_legs`` table in canonical column order (``None``: a null column)."""
    import numpy as np
    import pyarrow as pa

    n = len(rid)

    def ints(values):
        return pa.nulls(n, pa.int64()) if values is None else _ints(values)

    return pa.table(
        {
            "request_id": rid,
            "role": _strings([role], np.zeros(n, dtype=np.int32)),
            "node": node,
            "started_at": _ts(started),
            "finished_at": _ts(finished),
            "input_tokens": ints(cols["input_tokens"]),
            "reserved_tokens": ints(cols["reserved"]),
            "transferred_tokens": ints(cols["transferred"]),
            "bootstrap_room": room,
            "dp_rank": ints(cols["dp_rank"]),
            "finish_type": cols["finish"],
            "status_code": ints(cols["status"]),
            "error": cols["error"],
        }
    )


# A request reserving at least this many tokens on its decode rank queues for room there; the
# rest, each smaller, are held in a headroom of the pool that their peak on the rank that day
# (plus one more of them) fits in, and never less than a quarter of the pool.
QUEUED_TOKENS = 32_768


def admit(rank, start, end, tokens, queues: dict):
    """How long each request waits (us) before its decode rank has room for its reservation.

    ``rank``, ``start``, ``end`` and ``tokens`` are per request (its decode rank, when it would
    take and give back its pages, and how many tokens it reserves); ``queues`` holds each
    rank's admitted large requests across calls (a day's requests still holding pages at
    midnight). Requests of at least ``QUEUED_TOKENS`` are admitted in arrival order (first in,
    first out) into what the headroom leaves; the smaller ones never wait.

    >>> import numpy as np
    >>> queues = {}
    >>> wait = admit(np.array([0, 0, 0]), np.array([0, 10, 20]), np.array([100, 50, 30]),
    ...              np.array([900_000, 900_000, 1_000]), queues)
    >>> wait.tolist()  # the second waits for the first to give its pages back
    [0, 90, 0]
    """
    import heapq

    import numpy as np

    wait = np.zeros(len(rank), dtype=np.int64)
    small = tokens < QUEUED_TOKENS
    # Peak of the small requests per rank: a sweep over their takes and gives (gives first at
    # one instant), summed within each rank.
    peak: dict[int, int] = {}
    if small.any():
        r, t0, t1, k = rank[small], start[small], end[small], tokens[small]
        at = np.concatenate([t0, t1])
        delta = np.concatenate([k, -k])
        of = np.concatenate([r, r])
        order = np.lexsort((delta, at, of))
        of, delta = of[order], delta[order]
        held = np.cumsum(delta)
        first = np.flatnonzero(np.r_[True, of[1:] != of[:-1]])
        base = np.r_[0, held[first[1:] - 1]]
        held -= np.repeat(base, np.diff(np.r_[first, len(of)]))
        peak = dict(zip(of[first].tolist(), np.maximum.reduceat(held, first).tolist(), strict=True))
    large = np.flatnonzero(~small)
    large = large[np.lexsort((start[large], rank[large]))]
    for i in large.tolist():
        key = int(rank[i])
        queue = queues.setdefault(key, _Queue())
        room = DECODE_POOL - max(DECODE_POOL // 4, peak.get(key, 0) + QUEUED_TOKENS)
        at = max(int(start[i]), queue.last_start)
        while queue.holding and queue.holding[0][0] <= at:
            queue.held -= heapq.heappop(queue.holding)[1]
        need = int(tokens[i])
        while queue.holding and queue.held + need > room:
            done, freed = heapq.heappop(queue.holding)
            queue.held -= freed
            at = max(at, done)
        wait[i] = at - int(start[i])
        heapq.heappush(queue.holding, (int(end[i]) + wait[i], need))
        queue.held += need
        queue.last_start = at
    return wait


@dataclass
class _Queue:
    """One decode rank's admitted large requests: ``(end, tokens)`` of those holding pages (a
    heap by end), their tokens in all, and when the last one started (first in, first out)."""

    holding: list = field(default_factory=list)
    held: int = 0
    last_start: int = 0


def day_tables(
    shape: Shape, pop: Population, day: int, n: int, rng, queues: dict, decode_nodes=None
) -> tuple[dict, dict]:
    """One UTC day of traffic: the ``requests`` and the two ``engine_legs`` tables, and counts.

    ``queues`` carries each decode rank's admitted requests from one day to the next
    (:func:`admit`); ``decode_nodes`` (default all) are the decode nodes this part of the day
    routes to."""
    import numpy as np
    import pyarrow as pa

    day0 = us(START) + day * 86_400 * US
    # Arrivals: a daily cycle (three times as busy at the peak as in the trough), sorted.
    u = np.sort(rng.random(n))
    u = u - 0.5 * np.sin(2 * np.pi * u) / (2 * np.pi)
    received = day0 + (u * 86_400 * US).astype(np.int64)

    tenant = rng.choice(len(pop.weights), size=n, p=pop.weights)
    prompt = np.minimum(np.round(rng.lognormal(np.log(1500), 1.1, n)), 200_000).astype(np.int64)
    kind = rng.random(n)
    long_mask = kind < shape.long_share
    over_mask = (kind >= shape.long_share) & (kind < shape.long_share + shape.over_limit_share)
    past_mask = (kind >= shape.long_share + shape.over_limit_share) & (
        kind < shape.long_share + shape.over_limit_share + shape.past_window_share
    )
    heavy = long_mask | over_mask | past_mask
    tenant[heavy] = rng.choice(pop.long_ids, size=int(heavy.sum()), p=pop.long_weights)
    prompt[long_mask] = np.exp(rng.uniform(np.log(32_000), np.log(650_000), int(long_mask.sum())))
    prompt[over_mask] = rng.integers(limit(SMALL_POOL), CONTEXT, int(over_mask.sum()))
    prompt[past_mask] = rng.integers(CONTEXT, 1_300_000, int(past_mask.sum()))

    # The researcher reproduces the bug in bursts around the limit; the canary sends short
    # prompts all along.
    lo_r, hi_r = us(RESEARCHER_FROM), us(RESEARCHER_TO)
    in_window = np.flatnonzero((received >= lo_r) & (received < hi_r))
    per_day = shape.researcher_per_million * n * DAYS // 1_000_000 // 4 + 1
    if len(in_window):
        pick = np.sort(in_window[rng.integers(0, len(in_window), size=min(per_day, n))])
        tenant[pick] = len(pop.ids) - 2
        near = limit(SMALL_POOL)
        prompt[pick] = rng.integers(near - 30_000, near + 80_000, len(pick))
    canary = rng.random(n) < shape.internal_share
    tenant[canary] = len(pop.ids) - 1
    prompt[canary] = rng.integers(20, 400, int(canary.sum()))

    completion_want = np.minimum(np.round(rng.lognormal(np.log(250), 0.9, n)), 8192).astype(
        np.int64
    )
    cached = np.where(rng.random(n) < 0.3, (prompt * rng.uniform(0, 0.8, n)) // PAGE * PAGE, 0)
    cached = cached.astype(np.int64)

    prefill = rng.integers(0, shape.prefill_nodes, size=n)
    nodes = np.arange(shape.decode_nodes) if decode_nodes is None else np.asarray(decode_nodes)
    decode = nodes[rng.integers(0, len(nodes), size=n)]
    room = rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)
    dp_rank = room % shape.dp_size
    before, after = prefill_pools(shape)
    thr = np.where(
        received >= us(CONFIG_CHANGE_AT),
        np.array([limit(p) for p in after])[prefill],
        np.array([limit(p) for p in before])[prefill],
    )

    status_draw = rng.random(n)
    outcome = np.full(n, OK, dtype=np.int8)
    over = prompt >= thr
    outcome[over] = np.where(received[over] >= us(PATCH_AT), PREFILL_400, VICTIM)
    outcome[~over & (status_draw < shape.server_error_share)] = SERVER_ERROR
    outcome[~over & (status_draw > 1 - shape.rate_limited_share)] = RATE_LIMITED
    outcome[prompt >= CONTEXT] = TOKENIZER_400
    victim = outcome == VICTIM
    routed = (outcome != RATE_LIMITED) & (outcome != TOKENIZER_400)
    decoded = routed & (outcome != PREFILL_400)
    completion = np.where(decoded, completion_want, 0)
    completion = np.where(outcome == SERVER_ERROR, completion // 2, completion)

    # Timing (µs): dispatch, prefill queue and compute, KV transfer, decode steps.
    def micros(seconds):
        return np.maximum(np.round(seconds * US), 1).astype(np.int64)

    computed = np.where(victim, 1, prompt - cached).astype(np.float64)
    sent = np.where(victim, 1, prompt).astype(np.float64)
    prefill_s = (0.020 + 5e-5 * computed + 1.5e-10 * computed**2) * rng.uniform(0.9, 1.15, n)
    queue_s = rng.exponential(0.04, n) + np.where(
        rng.random(n) < 0.05, rng.exponential(2.0, n), 0.0
    )
    transfer_s = 0.002 + 3.5e-6 * np.ceil(sent / PAGE) * PAGE * rng.uniform(0.8, 1.3, n)
    tpot_s = (0.018 + 2e-8 * prompt) * rng.uniform(0.85, 1.2, n)
    prefill_start = received + micros(0.001 + 4e-7 * prompt + rng.exponential(0.002, n))
    decode_start = prefill_start + micros(0.0005 + rng.exponential(0.001, n))
    prefill_done = micros(queue_s + prefill_s + transfer_s)
    first_token = decode_start + prefill_done + micros(tpot_s)
    decode_end = decode_start + prefill_done + micros(tpot_s * np.maximum(completion, 1) + 5e-4)
    prefill_end = np.where(decoded, decode_start + prefill_done, prefill_start + 200)
    # A request whose decode rank has no room for its reservation waits (admit): its engine
    # work, and the answer after it, start that much later.
    holds = np.flatnonzero(decoded)
    reserve = -(-(prompt + completion + 1) // PAGE) * PAGE
    wait = np.zeros(n, dtype=np.int64)
    wait[holds] = admit(
        (decode * shape.dp_size + dp_rank)[holds],
        decode_start[holds],
        decode_end[holds],
        reserve[holds],
        queues,
    )
    for times in (prefill_start, decode_start, prefill_end, first_token, decode_end):
        times += wait
    completed = np.select(
        [decoded, outcome == PREFILL_400, outcome == RATE_LIMITED],
        [decode_end, prefill_end, received + micros(rng.uniform(0.005, 0.02, n))],
        received + micros(0.05 + 1e-7 * prompt),
    ) + micros(0.001 + rng.exponential(0.001, n))
    http = np.select(
        [outcome == RATE_LIMITED, outcome == SERVER_ERROR, outcome == TOKENIZER_400],
        [429, 500, 400],
        np.where(outcome == PREFILL_400, 400, 200),
    )
    finish = np.select(
        [outcome == SERVER_ERROR, completion >= 8192],
        [2, 1],
        0,
    )

    rid = _hex_ids(rng, n)
    key = tenant * 4 + (rng.random(n) * pop.key_count[tenant]).astype(np.int64)
    ip = tenant * 8 + rng.integers(0, 8, size=n)
    pnodes = node_names("prefill", shape.prefill_nodes)
    dnodes = node_names("decode", shape.decode_nodes)
    room_text = pa.array(room, pa.int64()).cast(pa.string())
    unrouted = ~routed
    requests = pa.table(
        {
            "request_id": rid,
            "tenant_id": _strings(pop.ids, tenant),
            "received_at": _ts(received),
            "prompt_tokens": _ints(prompt),
            "http_status": _ints(http),
            "completion_tokens": _ints(completion),
            "cached_tokens": _ints(cached),
            "first_token_at": _ts(first_token, ~decoded),
            "completed_at": _ts(completed),
            "ttft_ms": pa.array((first_token - received) / 1000.0, mask=~decoded),
            "e2e_ms": pa.array((completed - received) / 1000.0),
            "finish_reason": _strings(["stop", "length", "abort"], finish, ~decoded),
            "model": _strings([MODEL], np.zeros(n, dtype=np.int32)),
            "prefill_node": _strings(pnodes, prefill, unrouted),
            "decode_node": _strings(dnodes, decode, unrouted),
            "dp_rank": _ints(dp_rank, unrouted),
            "bootstrap_room": pa.array(room_text, mask=unrouted),
            "api_key_id": _strings(pop.keys, key),
            "client_ip": _strings(pop.ips, ip),
            "user_agent": _strings(pop.agents, pop.agent_of[tenant]),
        }
    )

    p_rows = np.flatnonzero(routed)
    prefill_legs = _legs(
        rid.take(p_rows),
        room_text.take(p_rows),
        "prefill",
        _strings(pnodes, prefill[p_rows]),
        prefill_start[p_rows],
        prefill_end[p_rows],
        input_tokens=np.where(over, 1, prompt)[p_rows],
        reserved=None,
        transferred=np.where(over, np.where(victim, 1, 0), prompt)[p_rows],
        dp_rank=None,
        finish=_strings(["length", "abort"], (outcome[p_rows] == PREFILL_400).astype(np.int32)),
        status=np.where(outcome == PREFILL_400, 400, 200)[p_rows],
        error=_messages(over[p_rows], prompt[p_rows], thr[p_rows]),
    )
    d_rows = np.flatnonzero(decoded)
    decode_legs = _legs(
        rid.take(d_rows),
        room_text.take(d_rows),
        "decode",
        _strings(dnodes, decode[d_rows]),
        decode_start[d_rows],
        decode_end[d_rows],
        input_tokens=prompt[d_rows],
        reserved=prompt[d_rows],
        transferred=np.where(victim, 1, prompt)[d_rows],
        dp_rank=dp_rank[d_rows],
        finish=_strings(["stop", "length", "abort"], finish[d_rows]),
        status=http[d_rows],
        error=pa.nulls(len(d_rows), pa.string()),
    )
    counts = {
        "requests": n,
        "affected": int(victim.sum()),
        "affected_researcher": int((victim & (tenant == len(pop.ids) - 2)).sum()),
        "long_prompts": int(long_mask.sum()),
        "engine_legs": len(p_rows) + len(d_rows),
    }
    order = {
        "requests": requests,
        "engine_legs-prefill": prefill_legs.sort_by("started_at"),
        "engine_legs-decode": decode_legs.sort_by("started_at"),
    }
    return order, counts


def snapshots(shape: Shape):
    """Every node's pool, every 6 hours and at the configuration change and the patch."""
    import pyarrow as pa

    step = 6 * 3600 * US
    instants = set(range(us(START), us(START) + DAYS * 86_400 * US, step))
    instants |= {us(CONFIG_CHANGE_AT), us(PATCH_AT)}
    before, after = prefill_pools(shape)
    prefill_names = node_names("prefill", shape.prefill_nodes)
    decode_names = node_names("decode", shape.decode_nodes)
    rows: dict[str, list] = {k: [] for k in ("node", "observed_at", "max_total_num_tokens")}
    rows |= {k: [] for k in ("role", "max_req_input_len", "context_length", "page_size")}
    rows |= {"dp_size": [], "engine_version": []}
    for t in sorted(instants):
        version = "0.5.14.post2" if t >= us(PATCH_AT) else "0.5.14"
        pools = after if t >= us(CONFIG_CHANGE_AT) else before
        nodes = [(n, p, "prefill", 1) for n, p in zip(prefill_names, pools, strict=True)]
        nodes += [(n, DECODE_POOL, "decode", shape.dp_size) for n in decode_names]
        for node, pool, role, dp in nodes:
            rows["node"].append(node)
            rows["observed_at"].append(t)
            rows["max_total_num_tokens"].append(pool)
            rows["role"].append(role)
            rows["max_req_input_len"].append(limit(pool))
            rows["context_length"].append(CONTEXT)
            rows["page_size"].append(PAGE)
            rows["dp_size"].append(dp)
            rows["engine_version"].append(version)
    table = pa.table(rows)
    return table.set_column(1, "observed_at", _ts(rows["observed_at"]))


def tenants_table(pop: Population):
    import pyarrow as pa

    return pa.table(
        {
            "tenant_id": pop.ids,
            "name": [f"Customer {i:04d}" for i in range(len(pop.ids) - 2)]
            + ["Security researcher", "Internal canary"],
            "contact": [f"security@{t.replace('_', '-')}.example" for t in pop.ids],
        }
    )


def _jsonl_gz(table) -> bytes:
    """A table as gzipped JSON Lines, timestamps as RFC 3339 strings with ``Z``."""
    import polars as pl

    df = pl.from_arrow(table)
    df = df.with_columns(
        [pl.col(c).dt.strftime(TS_FORMAT) for c, t in df.schema.items() if t == pl.Datetime]
    )
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=3) as gz:
        gz.write(df.write_ndjson().encode())
    return buf.getvalue()


def _write(
    folder: Path, name: str, table, pool: ThreadPoolExecutor, formats: tuple[str, ...] = FORMATS
) -> list:
    """Write one table in each of ``formats`` (JSON Lines compressed on the thread pool)."""
    import pyarrow.parquet as pq

    if "parquet" in formats:
        target = folder / "parquet" / "evidence" / f"{name}.parquet"
        pq.write_table(table, target, compression="zstd")
    if "jsonl" not in formats:
        return []
    target = folder / "jsonl" / "evidence" / f"{name}.jsonl.gz"
    return [pool.submit(lambda t=table, p=target: p.write_bytes(_jsonl_gz(t)))]


def manifest(fmt: str, requests: int) -> str:
    ext = "parquet" if fmt == "parquet" else "jsonl.gz"
    lines = [
        "# A benchmark case (benchmarks/casegen.py): synthetic traffic at scale, no ground truth.",
        "",
        "[incident]",
        f'id = "BENCH-{requests}"',
        f'title = "Benchmark case, {requests:,} requests ({fmt})"',
        f'model = "{MODEL}"',
        f'start = "{START:%Y-%m-%dT%H:%M:%SZ}"',
        f'end = "{START + timedelta(days=DAYS):%Y-%m-%dT%H:%M:%SZ}"',
        f"context_length = {CONTEXT}",
        'timezone = "UTC"',
        f'as_of = "{START + timedelta(days=DAYS + 1):%Y-%m-%dT%H:%M:%SZ}"',
        "",
        "[database]",
        'path = "case.duckdb"',
        "",
    ]
    for kind in KINDS:
        lines += [
            "[[evidence]]",
            f'kind = "{kind}"',
            'format = "canonical"',
            f'paths = ["evidence/{kind}*.{ext}"]',
            "",
        ]
    lines += [
        "[detection]",
        f"default_pool_tokens = {SMALL_POOL}",
        "latency_factor = 0.2",
        'overlap_window = "15m"',
        "",
        "[[exclusion]]",
        'name = "researcher"',
        'reason = "Bug bounty reproduction traffic"',
        f'tenant_ids = ["{RESEARCHER}"]',
        f'api_key_ids = ["{RESEARCHER_KEY}"]',
        "",
        "[[exclusion]]",
        'name = "internal"',
        'reason = "Internal canary and test traffic"',
        f'tenant_ids = ["{INTERNAL}"]',
        'user_agent_regex = "^kvf-canary/"',
        "",
        "[[timeline]]",
        f'at = "{REPORT_AT:%Y-%m-%dT%H:%M:%SZ}"',
        'event = "Report received through the bug bounty programme"',
        "",
        "[[timeline]]",
        f'at = "{CONFIG_CHANGE_AT:%Y-%m-%dT%H:%M:%SZ}"',
        'event = "Undersized prefill KV pools enlarged"',
        "",
        "[[timeline]]",
        f'at = "{PATCH_AT:%Y-%m-%dT%H:%M:%SZ}"',
        'event = "Engine 0.5.14.post2 deployed: rejected prompts no longer reach decode"',
        "fix = true",
        "",
    ]
    return "\n".join(lines)


# Requests generated at once: a day holding more is generated in parts, each written to its
# own files, so memory stays that of a 16M case's day (about 4 GB) whatever the size.
PART_REQUESTS = 1_200_000


def generate(
    folder: Path,
    requests: int,
    seed: int = 1,
    shape: Shape | None = None,
    formats: tuple[str, ...] = FORMATS,
) -> dict:
    """Write the case of ``requests`` requests into ``folder`` (``parquet/`` and ``jsonl/``,
    or the ``formats`` asked).

    The folder appears whole or not at all: everything is written beside it and renamed into
    place. A day of more than ``PART_REQUESTS`` requests is generated in parts (independent
    streams over the same day, superposed), written as ``KIND-DATE-pN`` files. Returns what
    ``meta.json`` holds: the generator version, shape and counts.
    """
    import numpy as np

    shape = shape or Shape()
    folder = Path(folder)
    work = folder.with_name(folder.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    for fmt in formats:
        (work / fmt / "evidence").mkdir(parents=True)
        (work / fmt / "case.toml").write_text(manifest(fmt, requests))

    streams = np.random.SeedSequence([GENERATOR_VERSION, seed, requests]).spawn(DAYS + 1)
    pop = population(shape, np.random.default_rng(streams[0]))
    per_day = np.full(DAYS, requests // DAYS)
    per_day[: requests % DAYS] += 1
    totals: dict[str, int] = {}
    queues: dict = {}  # each decode rank's admitted requests, day to day (admit)
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending = []
        for name, table in (("pool_snapshots", snapshots(shape)), ("tenants", tenants_table(pop))):
            totals[name] = table.num_rows
            pending += _write(work, name, table, pool, formats)
        for day in range(DAYS):
            date = (START + timedelta(days=day)).strftime("%Y-%m-%d")
            n = int(per_day[day])
            parts = -(-n // PART_REQUESTS)
            # One part draws from the day's own stream, so cases that fit stay as they were.
            seeds = [streams[day + 1]] if parts == 1 else streams[day + 1].spawn(parts)
            for part, part_seed in enumerate(seeds):
                size = n // parts + (part < n % parts)
                rng = np.random.default_rng(part_seed)
                # Parts of a day are generated apart but run at once: each routes to its own
                # decode nodes, so that each rank's admission sees all of its requests.
                nodes = np.arange(part, shape.decode_nodes, parts)
                tables, counts = day_tables(shape, pop, day, size, rng, queues, nodes)
                for k, v in counts.items():
                    totals[k] = totals.get(k, 0) + v
                suffix = date if parts == 1 else f"{date}-p{part + 1}"
                for name, table in tables.items():
                    # Hold at most a day of JSON Lines in flight: finish the oldest first.
                    while len(pending) >= 3:
                        pending.pop(0).result()
                    pending += _write(work, f"{name}-{suffix}", table, pool, formats)
                del tables
        for f in pending:
            f.result()
    meta = {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "shape": asdict(shape),
        "days": DAYS,
        **totals,
        "bytes": {
            fmt: sum(p.stat().st_size for p in (work / fmt / "evidence").iterdir())
            for fmt in formats
        },
    }
    (work / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    work.rename(folder)
    return meta


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write a benchmark case (Parquet and JSON Lines).")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="fleet64")
    parser.add_argument("--formats", default=",".join(FORMATS), help="parquet,jsonl or one")
    args = parser.parse_args(argv)
    formats = tuple(f for f in FORMATS if f in args.formats.split(","))
    if not formats:
        parser.error(f"--formats: one or more of {', '.join(FORMATS)}")
    meta = generate(args.folder, args.requests, args.seed, SHAPES[args.shape], formats)
    print(json.dumps({k: meta[k] for k in ("requests", "engine_legs", "affected", "bytes")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
