"""Every tunable of detection, in one registry: the manifest's ``[detection]`` may set any of
them, the report's methodology shows each with its default, and nothing else reads a default.

Two kinds: each detector's parameters (declared in its ``queries/*.yml``) and the case-level
ones declared here (verdicts, coverage, the exploitation assessment). Two detector parameters
are derived from the manifest, never set directly: ``context_length`` (``[incident]``) and
``default_threshold_tokens`` (``[detection].default_pool_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DERIVED = ("context_length", "default_threshold_tokens")


@dataclass(frozen=True)
class Parameter:
    """A tunable: its default, what it means, who reads it, and the open interval it must
    lie in (``above`` < value < ``below``; None leaves that side open)."""

    name: str
    default: Any
    description: str
    owner: str
    above: float | None = 0
    below: float | None = None

    def check(self, value: Any) -> Any:
        """The value if it is of the default's kind and in range; ValueError says why not.

        >>> PARAMETERS["exploitation_high_points"].check(2)
        2.0
        >>> PARAMETERS["continue_tokens"].check(1.5)
        Traceback (most recent call last):
        ...
        ValueError: must be a whole number, got 1.5
        """
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {value!r}")
        if isinstance(self.default, int) and not isinstance(self.default, bool):
            if not isinstance(value, int):
                raise ValueError(f"must be a whole number, got {value!r}")
        else:
            value = float(value)
        low_ok = self.above is None or value > self.above
        high_ok = self.below is None or value < self.below
        if low_ok and high_ok:
            return value
        if self.above is not None and self.below is not None:
            what = f"a number between {self.above:g} and {self.below:g}"
        elif self.above is not None:
            what = f"above {self.above:g}"
        else:
            what = f"below {self.below:g}"
        raise ValueError(f"must be {what}, got {value!r}")


_CASE = (
    Parameter(
        "long_prompt_tokens",
        65536,
        "token_mismatch on a prompt at least this long is likely, not possible",
        "verdicts",
    ),
    Parameter(
        "coverage_gap_s",
        1800.0,
        "a node silent this many seconds while others work is a hole in its log",
        "coverage",
    ),
    Parameter(
        "exploitation_band",
        0.20,
        "prompts within this fraction of a probeable limit are examined",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_near",
        0.05,
        "'near a limit' for searches and isolation, as a fraction of it",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_question_tokens",
        1000,
        "lengths closer than this to an earlier one re-ask the same thing",
        "exploitation",
    ),
    Parameter(
        "exploitation_focus_p",
        1e-5,
        "a pile-up at a limit counts when chance would put so many there with at most this"
        " probability",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_isolation_p",
        1e-4,
        "novel long lengths this unlikely to lie near a limit by chance are worth a point",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_isolation_half_p",
        1e-3,
        "... and half a point up to this probability",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_bisection_p",
        1e-4,
        "a halving run this unlikely among the tenant's steps by chance is worth a point (two"
        " at a hundredth of it)",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_bisection_half_p",
        1e-3,
        "... and half a point up to this probability",
        "exploitation",
        below=1,
    ),
    Parameter(
        "exploitation_harvest_min",
        20,
        "copies of one exact over-limit length that make a harvest",
        "exploitation",
    ),
    Parameter(
        "exploitation_harvest_long",
        100,
        "copies that make a harvest worth two points",
        "exploitation",
    ),
    Parameter(
        "exploitation_high_points",
        1.5,
        "points for high (one point is medium)",
        "exploitation",
        above=1,
    ),
    Parameter(
        "exploitation_min_attempts",
        3,
        "over-limit attempts that make a tenant low without any pattern",
        "exploitation",
    ),
    Parameter(
        "exploitation_burst_attempts",
        5,
        "over-limit prompts in 10 minutes reported as a burst",
        "exploitation",
    ),
    Parameter(
        "continue_window_s",
        7200,
        "a prompt continues an earlier one arriving at most this long after its answer",
        "exploitation",
    ),
    Parameter(
        "continue_tokens",
        16384,
        "... longer by the answer and at most this many tokens",
        "exploitation",
    ),
    Parameter(
        "continue_ratio",
        0.05,
        "... or at most this fraction of the earlier prompt, if more",
        "exploitation",
        below=1,
    ),
)

PARAMETERS: dict[str, Parameter] = {p.name: p for p in _CASE}


def tunable_parameters() -> dict[str, Parameter]:
    """Every parameter ``[detection]`` may set: the case-level ones and each detector's.

    >>> params = tunable_parameters()
    >>> params["latency_factor"].owner, params["exploitation_high_points"].owner
    ('latency_too_good', 'exploitation')
    >>> "context_length" in params
    False
    """
    from forensics.detectors import load_detectors

    out = dict(PARAMETERS)
    for det in load_detectors():
        for name, spec in det.parameters.items():
            if name in DERIVED or name in out:
                continue
            out[name] = Parameter(
                name,
                spec["default"],
                spec["description"],
                det.id,
                above=spec.get("above", 0),
                below=spec.get("below"),
            )
    return out


def defaults() -> dict[str, Any]:
    """Every tunable's default, by name."""
    return {name: p.default for name, p in tunable_parameters().items()}
