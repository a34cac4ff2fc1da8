"""Long-context customers: conversations over a document, coding agents, document questions.

Every session is a client that waits for each answer. A prompt that continues an earlier turn is
exactly that turn's prompt, plus the completion the client received (``min(requested,
max_tokens)``, less only if the decode pool ran out of room; nothing after an HTTP 400), plus
what the user or a tool adds. The next request leaves once the answer is back (as the fleet's
``ClientView.wait_s`` foresees it: an answer delayed by queueing for decode pages arrives after
it, for about one continuation in a hundred at 1M requests, fewer in smaller cases) and the user
has read it or the tool has run. Session starts follow the diurnal rate; a tenant starts
sessions until its request budget (``traffic.long_budgets``) is spent or the simulated window
ends.

- ``longctx``: conversations replayed from the Mooncake FAST'25 conversation trace's turn
  structure (``data/mooncake_sessions.csv.gz``; see ``data/README.md``): a session drawn
  uniformly from its 8,056 conversations keeps its turns, branches (re-asked turns), requested
  output lengths and user messages. The trace has no prompt beyond 126K tokens, so every
  session opens on a document of ``DOC_TOKENS`` (uniform, drawn independently of any limit),
  which puts it in the 250K-1.1M range; a session whose opening turns sit just below a limit
  crosses it as it grows, and keeps going. Think time: the trace's gap between a turn and the
  one it follows, less the trace turn's own answer time, at least ``MIN_THINK_S``. After an
  HTTP 400 the user resends once (``RESEND_S`` later) and then gives up; a prompt over the
  context window ends the conversation.
- ``agentic``: a coding agent starting from a repository context (``AGENT_REPO``), each step a
  model call followed by a tool run (``AGENT_TOOL_S``) whose result (``AGENT_TOOL``: hundreds to
  tens of thousands of tokens) joins the next prompt with the completion. When the next prompt
  would pass the tenant's compaction point (``AGENT_COMPACT_AT`` of the window) the agent asks
  for a summary (a last call on the full context) and restarts from its base prompt, the
  summary and the pending tool result. Steps per session ``AGENT_STEPS``. A refused call is
  retried (``AGENT_RETRIES`` attempts, a few seconds apart) before the agent stops.
- ``docqa``: a tenant with one to three fixed documents (``DOCQA_DOC``, uniform) asks questions
  over one of them per visit: prompt = document + the tenant's instructions + a question of
  ``DOCQA_QUESTION`` tokens; one to a few questions per visit, visits spread over the days.

The log-normal parameters (mu, sigma of the log, with clips) of the agent are assumptions
about coding agents, not fits: no public trace shows agents at this context length.
Completions: the Mooncake trace's own output lengths for ``longctx``, and its completion fit
(mu 5.336 sigma 1.358, see ``traffic``) for ``agentic`` and ``docqa``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from forensics.simulate.config import US, SimConfig
from forensics.simulate.fleet import OK, TOKENIZER_400, VICTIM, ClientView

if TYPE_CHECKING:
    import numpy as np

    from forensics.simulate.traffic import Sender, Tenants

TRACE_FILE = "mooncake_sessions.csv.gz"
DOC_TOKENS = (250_000, 1_000_000)
MIN_THINK_S = 2.0
RESEND_S = (5.0, 40.0)

COMPLETION = (5.336, 1.358)
AGENT_BASE = (8_000, 30_000)  # system prompt and tool definitions, per tenant (uniform)
AGENT_TASK = (math.log(300), 1.0, 20, 5_000)
AGENT_REPO = (math.log(60_000), 1.0, 5_000, 700_000)
AGENT_STEPS = (math.log(60), 1.0, 3, 600)
AGENT_TOOL = (math.log(1_500), 1.3, 30, 60_000)
AGENT_TOOL_S = (math.log(4.0), 1.0, 0.5, 600.0)
AGENT_COMPACT_AT = (0.80, 0.95)  # per tenant (uniform)
AGENT_SUMMARY = (2_000, 10_000)  # tokens the summary call asks for (uniform)
AGENT_INSTRUCTION = (200, 600)  # the summary request's instruction (uniform)
AGENT_RETRIES = 3
AGENT_RETRY_S = (2.0, 10.0)

DOCQA_DOC = (300_000, 1_040_000)
DOCQA_TEMPLATE = (200, 1_500)
DOCQA_QUESTION = (math.log(60), 0.8, 8, 600)
DOCQA_THINK_S = (15.0, 180.0)
DOCQA_MORE = 0.55  # chance of one more question in the same visit


@lru_cache(maxsize=1)
def load_trace() -> tuple[dict[str, list[int]], list[int]]:
    """The derived Mooncake sessions (package data): columns as lists, and session bounds."""
    import gzip
    import io
    from importlib.resources import files

    import polars as pl

    raw = files("forensics.simulate").joinpath("data", TRACE_FILE).read_bytes()
    df = pl.read_csv(io.BytesIO(gzip.decompress(raw)))
    cols = {c: df[c].to_list() for c in df.columns}
    sess = cols["session"]
    bounds = [0] + [i for i in range(1, len(sess)) if sess[i] != sess[i - 1]] + [len(sess)]
    return cols, bounds


def _draw(rng: np.random.Generator, spec: tuple[float, float, float, float]) -> float:
    mu, sigma, lo, hi = spec
    return min(max(math.exp(rng.normal(mu, sigma)), lo), hi)


def _starts(cfg: SimConfig, budget: int, rng: np.random.Generator) -> list[int]:
    """Enough diurnal session starts for the budget, in random order (so a budget spent early
    leaves no part of the window empty)."""
    from forensics.simulate.traffic import diurnal_times

    return rng.permutation(diurnal_times(cfg, budget, rng)).tolist()


class _Session:
    """One session's bookkeeping: its number, tenant, client, and the budget left."""

    def __init__(self, sender: Sender, tenant: int, budget: int, number: int):
        self.sender, self.tenant, self.budget, self.number = sender, tenant, budget, number
        self.client = sender.client(tenant)

    def spent(self) -> bool:
        return self.sender.count.get(self.tenant, 0) >= self.budget

    def send(self, t_us: int, prompt: int, completion: int, max_tokens: int, **kw):
        if self.spent():
            return None
        return self.sender.send(
            self.tenant,
            t_us,
            prompt,
            completion,
            max_tokens,
            self.client,
            session=self.number,
            **kw,
        )


def session_traffic(
    cfg: SimConfig, tenants: Tenants, budgets: dict[int, int], sender: Sender
) -> dict[str, dict[str, int]]:
    """Every long-context tenant's sessions, sent through ``sender``.

    Returns:
        Per profile: sessions and requests.
    """
    gen = {"longctx": _longctx, "agentic": _agentic, "docqa": _docqa}
    number = 0
    stats: dict[str, dict[str, int]] = {}
    for tenant, budget in sorted(budgets.items()):
        profile = tenants.profiles[tenant]
        before = sender.count.get(tenant, 0)
        first = number
        number = gen[profile](cfg, tenants, tenant, budget, sender, number)
        st = stats.setdefault(profile, {"tenants": 0, "sessions": 0, "requests": 0})
        st["tenants"] += 1
        st["sessions"] += number - first
        st["requests"] += sender.count.get(tenant, 0) - before
    return stats


def _send_until_answered(s: _Session, t: int, attempts: int, pause_s, rng, *args, **kw):
    """Send, and resend after a refusal (``attempts`` in all, ``pause_s`` apart). Returns the
    answered request's (prompt, outcome, received, done), or None if it never was."""
    for attempt in range(1, attempts + 1):
        r = s.send(t, *args, attempt=attempt, **kw)
        if r is None:
            return None
        if r[1] in (OK, VICTIM):
            return r
        if r[1] == TOKENIZER_400:  # over the context window: resending cannot help
            return None
        t = r[3] + round(rng.uniform(*pause_s) * US)
    return None


def _longctx(cfg, tenants, tenant, budget, sender, number) -> int:
    rng = sender.rng
    cols, bounds = load_trace()
    parent_of, off, inp, out, add = (
        cols[c] for c in ("parent", "offset_ms", "input_length", "output_length", "added_tokens")
    )
    max_tokens = tenants.max_tokens[tenant]
    for start in _starts(cfg, budget, rng):
        s = _Session(sender, tenant, budget, number)
        if s.spent():
            break
        number += 1
        k = int(rng.integers(len(bounds) - 1))
        a, b = bounds[k], bounds[k + 1]
        doc = int(rng.integers(*DOC_TOKENS))
        prompts: dict[int, int] = {}
        got: dict[int, int] = {}
        done: dict[int, int] = {}
        opening = None
        for j in range(b - a):
            p = parent_of[a + j]
            if p < 0:  # the opening, or the user re-asking it
                prompt, ref, added = doc + inp[a + j], opening, doc + inp[a + j]
            else:
                prompt, ref, added = prompts[p] + got[p] + add[a + j], p, add[a + j]
            if ref is None:
                t = start
            else:
                gap = (off[a + j] - off[a + ref]) / 1000
                trace_wait = ClientView.wait_s(inp[a + ref], 0, out[a + ref], OK)
                t = done[ref] + round(max(MIN_THINK_S, gap - trace_wait) * US)
            r = _send_until_answered(
                s,
                t,
                2,
                RESEND_S,
                rng,
                prompt,
                out[a + j],
                max_tokens,
                turn=j,
                parent=p,
                added=added,
            )
            if r is None:
                break
            prompts[j], _, got[j], done[j] = r
            if p < 0:
                opening = j
    return number


def _agentic(cfg, tenants, tenant, budget, sender, number) -> int:
    rng = sender.rng
    max_tokens = tenants.max_tokens[tenant]
    base = int(rng.integers(*AGENT_BASE))
    compact_at = int(rng.uniform(*AGENT_COMPACT_AT) * cfg.context_length)
    for start in _starts(cfg, budget, rng):
        s = _Session(sender, tenant, budget, number)
        if s.spent():
            break
        number += 1
        steps = int(_draw(rng, AGENT_STEPS))
        prompt = base + int(_draw(rng, AGENT_REPO)) + int(_draw(rng, AGENT_TASK))
        parent, added, t = -1, prompt, start
        turn = 0
        while turn < steps:
            completion = max(1, round(math.exp(rng.normal(*COMPLETION))))
            r = _send_until_answered(
                s,
                t,
                AGENT_RETRIES,
                AGENT_RETRY_S,
                rng,
                prompt,
                completion,
                max_tokens,
                turn=turn,
                parent=parent,
                added=added,
            )
            if r is None:
                break
            sent, _, got, done = r
            tool = int(_draw(rng, AGENT_TOOL))
            t = done + round(_draw(rng, AGENT_TOOL_S) * US)
            if sent + got + tool <= compact_at:
                prompt, parent, added = sent + got + tool, turn, tool
                turn += 1
                continue
            # Near the window: summarise the whole context, then restart from the summary.
            instruction = int(rng.integers(*AGENT_INSTRUCTION))
            turn += 1
            r = _send_until_answered(
                s,
                t,
                AGENT_RETRIES,
                AGENT_RETRY_S,
                rng,
                sent + got + instruction,
                int(rng.integers(*AGENT_SUMMARY)),
                max_tokens,
                turn=turn,
                parent=turn - 1,
                added=instruction,
            )
            if r is None:
                break
            _, _, summary, done = r
            prompt = base + summary + tool
            parent, added = -1, prompt
            t = done + round(rng.uniform(0.2, 2.0) * US)
            turn += 1
    return number


def _docqa(cfg, tenants, tenant, budget, sender, number) -> int:
    rng = sender.rng
    max_tokens = tenants.max_tokens[tenant]
    n_docs = int(rng.integers(1, 4))
    docs = rng.integers(*DOCQA_DOC, size=n_docs).tolist()
    popularity = rng.dirichlet([1.0] * n_docs)
    template = int(rng.integers(*DOCQA_TEMPLATE))
    for start in _starts(cfg, budget, rng):
        s = _Session(sender, tenant, budget, number)
        if s.spent():
            break
        number += 1
        doc = docs[int(rng.choice(n_docs, p=popularity))]
        t, turn = start, 0
        while True:
            prompt = doc + template + int(_draw(rng, DOCQA_QUESTION))
            completion = max(1, round(math.exp(rng.normal(*COMPLETION))))
            r = _send_until_answered(
                s, t, 2, RESEND_S, rng, prompt, completion, max_tokens, turn=turn, added=prompt
            )
            if r is None or rng.random() >= DOCQA_MORE:
                break
            t = r[3] + round(rng.uniform(*DOCQA_THINK_S) * US)
            turn += 1
    return number
