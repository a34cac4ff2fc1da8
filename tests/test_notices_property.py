"""Property: no notice ever contains another tenant's id or request ids.

Tenant ids look like ``t<...#i>`` and request ids ``r[...#i]`` where the inner text never holds
``<>[]#``: no id can then be a substring of another, so a plain substring search is exact.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from fixtures.findings.builder import build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.report.data import generation_time
from forensics.report.outputs import write_notices
from forensics.report.render import md_code, md_text
from forensics.scope import scope_case

INNER = st.text(
    alphabet=st.characters(
        codec="utf-8",
        categories=("L", "N", "P", "S"),
        exclude_characters="<>[]#|`\\&",
    ),
    max_size=8,
)
VERDICTS = st.sampled_from(["confirmed", "likely", "possible"])
METHODS = st.sampled_from(
    [("allocation_log", "exact"), ("allocator_replay", "high"), ("temporal", "low")]
)


@st.composite
def cases(draw):
    n_tenants = draw(st.integers(2, 6))
    tenants = [f"t<{draw(INNER)}#{i}>" for i in range(n_tenants)]
    excluded = {t: "researcher" for t in tenants[1:] if draw(st.booleans()) and draw(st.booleans())}
    n_requests = draw(st.integers(2, 14))
    requests = []
    for i in range(n_requests):
        tenant = draw(st.sampled_from(tenants))
        requests.append(
            (
                f"r[{draw(INNER)}#{i}]",
                tenant,
                f"2026-09-01T10:{i:02d}:00Z",
                draw(st.integers(1, 1_048_576)),
                100.0 + i,
                f"decode-{i % 2}",
            )
        )
    affected_ids = draw(st.sets(st.sampled_from([r[0] for r in requests]), min_size=1))
    tenant_of = {r[0]: r[1] for r in requests}
    affected = [
        (rid, draw(VERDICTS), "over_pool", excluded.get(tenant_of[rid]))
        for rid in sorted(affected_ids)
    ]
    exposures = []
    for rid in sorted(affected_ids):
        sources = draw(st.lists(st.sampled_from([r[0] for r in requests]), max_size=3, unique=True))
        for rank, src in enumerate(sources, start=1):
            if src != rid:
                method, conf = draw(METHODS)
                exposures.append((rid, src, method, 1000, conf, rank))
    return requests, affected, exposures, excluded


def forms(value: str) -> set[str]:
    # The raw id and the escaped forms the Markdown filters could turn it into.
    return {value, md_text(value), md_code(value).strip("` ")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_notice_mentions_another_tenant(generated):
    requests, affected, exposures, excluded = generated
    with tempfile.TemporaryDirectory() as tmp:
        case, con = build(
            Path(tmp),
            requests=requests,
            affected=affected,
            exposures=exposures,
            excluded_tenants=excluded,
        )
        try:
            scope = scope_case(con, case)
            paths = write_notices(
                con,
                case,
                scope,
                Path(tmp) / "notices",
                generated_at=generation_time(con, case, None),
                window={"start": "", "end": ""},
                tenant_ids={r[1] for r in requests},
            )
            # One letter and one CSV of its requests per notified tenant.
            assert len(paths) == 2 * len(scope.tenants)
            assert {p.stem for p in paths if p.suffix == ".csv"} == {
                p.stem for p in paths if p.suffix == ".md"
            }
            letters = {p.stem: p.read_text(encoding="utf-8") for p in paths if p.suffix == ".md"}
            owners = {}
            for tenant in scope.tenants:
                mine = [stem for stem, text in letters.items() if tenant in text]
                assert len(mine) == 1, (tenant, mine)
                owners[mine[0]] = tenant
            for path in paths:
                text = path.read_text(encoding="utf-8")
                tenant = owners[path.stem]
                own_requests = {r[0] for r in requests if r[1] == tenant}
                others = [t for t in {r[1] for r in requests} if t != tenant]
                others += [r[0] for r in requests if r[0] not in own_requests]
                leaked = [o for o in others if any(f in text for f in forms(o) if f)]
                assert leaked == [], (tenant, leaked)
        finally:
            con.close()
