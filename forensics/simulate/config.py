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
    # Traffic.
    tenants: int = 120
    agentic_share: float = 0.10  # fraction of customer tenants doing agentic coding
    long_prompt_fraction: float = 0.0025  # of customer requests: 650K-1.06M token prompts
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
        if self.tenants < 3:
            raise ForensicsError("simulate: tenants must be at least 3")
        for pool in self.decode_pools:
            if pool // self.page_size < 2:
                raise ForensicsError("simulate: a decode pool must hold at least two pages")
        return self


def make_config(**overrides) -> SimConfig:
    """A SimConfig with the given fields replaced.

    Raises:
        ForensicsError: an unknown field name.
    """
    known = {f.name for f in fields(SimConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ForensicsError(f"simulate: unknown setting(s): {', '.join(unknown)}")
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
    return replace(SimConfig(), **overrides).validate()
