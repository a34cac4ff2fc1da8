"""A faithful simulator of the incident: a PD-disaggregated fleet, its traffic and its bug.

``simulate_case`` writes a complete case folder: ``case.toml``, canonical evidence under
``evidence/`` and the ground truth under ``truth/``. The truth comes from the simulation itself
(which requests took the bug path, and which earlier requests last wrote each stale page the
allocator handed them), never from re-reading the evidence, and this package imports nothing
from detection, attribution or scoping.

Layout: ``driver`` (``simulate_case``, step by step), ``config`` (fleet and knobs),
``traffic`` (tenants, arrivals, lengths), ``sessions``
(long-context customers: conversations, coding agents, document questions), ``probers``
(customers probing the limit on purpose), ``fleet`` (routing, code paths, leg durations),
``allocator`` (decode page pools and page writers), ``evidence`` and ``truth`` (what is
written), ``writer`` (file formats), ``formats`` (real log formats). ``data/`` holds the
conversation structure replayed by ``sessions`` (derived from a public trace; see its README).

The truth also says who each tenant is (``truth/tenants.csv``: profile, and whether it
triggered the bug on purpose, with which strategy), which session and turn every long-context
request belongs to (``truth/sessions.csv``) and which prober requests probed or exploited
(``truth/probes.csv``).
"""

from __future__ import annotations

from forensics.simulate.config import SimConfig
from forensics.simulate.driver import FORMATS, SimulationSummary, simulate_case

__all__ = ["FORMATS", "SimConfig", "SimulationSummary", "simulate_case"]
