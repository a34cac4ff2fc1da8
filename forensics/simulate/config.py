"""Simulation parameters: the fleet, its configuration history and the traffic mix.

Everything here is plain data (no numpy) so ``forensics --help`` stays instant and a caller can
override any field through ``simulate_case(**config)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta

from forensics.errors import ForensicsError

MODEL = "glm-5.3"
CONTEXT_LENGTH = 1_048_576
SMALL_PREFILL_POOL = 681_280
ENGINE_VERSION_BEFORE = "0.5.14"
ENGINE_VERSION_AFTER = "0.5.14.post2"

US = 1_000_000  # microseconds per second: every simulated instant is an integer of these

# How a deliberate prober looks for the limit (forensics.simulate.probers implements each).
PROBER_STRATEGIES = ("binary_search", "sweep", "repeat", "slow")


def parse_probers(value) -> tuple[str, ...]:
    """Prober strategies from a comma-separated string or a sequence of names.

    >>> parse_probers("sweep, repeat")
    ('sweep', 'repeat')
    >>> parse_probers("bisect")
    Traceback (most recent call last):
    ...
    ValueError: unknown prober strategy 'bisect' (choose from: binary_search, sweep, repeat, slow)
    """
    names = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(str(n).strip() for n in names if str(n).strip())
    for name in out:
        if name not in PROBER_STRATEGIES:
            raise ValueError(
                f"unknown prober strategy {name!r} (choose from: {', '.join(PROBER_STRATEGIES)})"
            )
    return out


def max_req_input_len(pool_tokens: int, context_length: int) -> int:
    """The engine's input limit for a pool: ``min(context_length - 1, pool - 1) - 5``.

    >>> max_req_input_len(681_280, 1_048_576)
    681274
    """
    return min(context_length - 1, pool_tokens - 1) - 5


@dataclass(frozen=True)
class SimConfig:
    """Every knob of one simulated case. Defaults reproduce the incident's shape.

    Times are UTC. Pools are in tokens; decode pools are per data-parallel rank.
    """

    start: datetime = datetime(2026, 8, 27, tzinfo=UTC)
    days: float = 15.0
    page_size: int = 64
    context_length: int = CONTEXT_LENGTH
    model: str = MODEL
    # Prefill pools before and after the configuration change (one entry per prefill node).
    # Two nodes run the undersized pool of the incident, one a medium pool whose threshold
    # sits at ~917K (still exploitable until the engine patch), one a pool above the window.
    prefill_pools: tuple[int, ...] = (SMALL_PREFILL_POOL, SMALL_PREFILL_POOL, 917_504, 1_310_720)
    prefill_pools_after: tuple[int, ...] = (1_310_720, 1_310_720, 917_504, 1_310_720)
    # Decode nodes: data-parallel ranks and the pool of one rank. decode-2's ranks cannot hold
    # the longest prompts, so those are refused at decode (HTTP 400, nothing allocated).
    decode_dp_sizes: tuple[int, ...] = (4, 2, 4, 3)
    decode_pools: tuple[int, ...] = (1_245_184, 1_245_184, 983_040, 1_114_112)
    config_change_at: datetime = datetime(2026, 9, 8, 22, 30, tzinfo=UTC)
    patch_at: datetime = datetime(2026, 9, 9, 19, 40, tzinfo=UTC)
    report_at: datetime = datetime(2026, 9, 8, 14, 2, tzinfo=UTC)
    snapshot_every_hours: float = 6.0
    # Traffic. Customer tenants are short-prompt (chat, code, rag) or long-context (agentic,
    # longctx, docqa); the long-context ones send their requests in sessions (see traffic).
    tenants: int = 120
    agentic_share: float = 0.04  # fraction of customer tenants running coding agents
    longctx_share: float = 0.05  # fraction of customer tenants in long-document conversations
    docqa_tenants: int = 2  # tenants re-asking questions over a few fixed large documents
    # Fraction of customer requests sent by the long-context tenants (their sessions). It
    # replaces long_prompt_fraction, the share of independent 650K-1.06M token prompts.
    long_context_fraction: float = 0.01
    # Customer tenants probing the limit on purpose, one per entry (see PROBER_STRATEGIES).
    probers: tuple[str, ...] = ()
    researcher_bursts: int = 6
    researcher_burst_size: tuple[int, int] = (8, 16)
    researcher_start: datetime = datetime(2026, 9, 5, 8, tzinfo=UTC)
    researcher_end: datetime = datetime(2026, 9, 8, 12, tzinfo=UTC)
    canary_every_minutes: float = 30.0
    long_canary_every_hours: float = 12.0

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)

    def us(self, when: datetime) -> int:
        """An instant as integer microseconds since the epoch."""
        delta = when - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds

    def validate(self) -> SimConfig:
        """Check the fleet is coherent; raise ForensicsError naming the bad field."""
        if len(self.prefill_pools) != len(self.prefill_pools_after) or not self.prefill_pools:
            raise ForensicsError("simulate: prefill_pools and prefill_pools_after differ in length")
        if len(self.decode_dp_sizes) != len(self.decode_pools) or not self.decode_pools:
            raise ForensicsError("simulate: decode_dp_sizes and decode_pools differ in length")
        if self.page_size <= 0:
            raise ForensicsError("simulate: page_size must be positive")
        if self.days <= 0:
            raise ForensicsError("simulate: days must be positive")
        # The researcher's bursts have dates of their own; outside the case's window they would
        # be truth the manifest's incident window leaves out.
        if self.researcher_bursts and not (
            self.start <= self.researcher_start < self.researcher_end <= self.end
        ):
            raise ForensicsError(
                "simulate: the researcher's bursts (researcher_start to researcher_end) must "
                "fall within the simulated days (start to start + days)"
            )
        if self.tenants < 3:
            raise ForensicsError("simulate: tenants must be at least 3")
        for name in ("agentic_share", "longctx_share", "long_context_fraction"):
            if not 0 <= getattr(self, name) <= 0.5:
                raise ForensicsError(f"simulate: {name} must be between 0 and 0.5")
        if self.docqa_tenants < 0:
            raise ForensicsError("simulate: docqa_tenants must not be negative")
        try:
            parse_probers(self.probers)
        except ValueError as e:
            raise ForensicsError(f"simulate: {e}") from None
        for pool in self.decode_pools:
            if pool // self.page_size < 2:
                raise ForensicsError("simulate: a decode pool must hold at least two pages")
        return self


# Settings of earlier versions, and what took their place.
REPLACED = {
    "long_prompt_fraction": "replaced by long_context_fraction, the share of customer requests "
    "sent by long-context sessions",
}


def make_config(**overrides) -> SimConfig:
    """A SimConfig with the given fields replaced.

    Raises:
        ForensicsError: an unknown field name.
    """
    known = {f.name for f in fields(SimConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        hints = [f"{k}: {REPLACED[k]}" for k in unknown if k in REPLACED]
        hint = f" ({'; '.join(hints)})" if hints else ""
        raise ForensicsError(f"simulate: unknown setting(s): {', '.join(unknown)}{hint}")
    for key in (
        "start",
        "config_change_at",
        "patch_at",
        "report_at",
        "researcher_start",
        "researcher_end",
    ):
        value = overrides.get(key)
        if isinstance(value, str):
            overrides[key] = datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    for key in ("prefill_pools", "prefill_pools_after", "decode_dp_sizes", "decode_pools"):
        if key in overrides:
            overrides[key] = tuple(int(v) for v in overrides[key])
    if "probers" in overrides:
        try:
            overrides["probers"] = parse_probers(overrides["probers"])
        except ValueError as e:
            raise ForensicsError(f"simulate: {e}") from None
    return replace(SimConfig(), **overrides).validate()
