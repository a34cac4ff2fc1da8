"""Notification scoping on hand-built findings (tests/fixtures/findings/builder.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fixtures.findings.builder import AFFECTED, TRAVERSAL, XSS, build

from forensics.errors import ForensicsError
from forensics.scope import scope_case


def at(h: int, m: int = 0) -> datetime:
    return datetime(2026, 9, 1, h, m, tzinfo=UTC)


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    case, con = build(tmp_path_factory.mktemp("scope"))
    yield case, con, scope_case(con, case)
    con.close()


def rows(scope):
    return [
        (n.tenant_id, n.role, n.responses, n.first_at, n.last_at, n.confidence)
        for n in scope.notifications
    ]


def test_standard_case_notifies_exactly_the_expected_tenants(standard):
    _, _, scope = standard
    assert rows(scope) == [
        (TRAVERSAL, "source", 1, at(11, 30), at(11, 30), "high"),
        (XSS, "recipient", 1, at(10, 40), at(10, 40), "confirmed"),
        ("acct_alpha", "recipient", 2, at(10, 0), at(10, 1), "confirmed"),
        ("acct_beta", "source", 2, at(10, 0), at(11, 10), "exact"),
    ]


def test_candidates_and_possible_only_go_to_review_with_a_reason(standard):
    _, con, scope = standard
    got = [(r.tenant_id, r.role, r.responses, r.confidence) for r in scope.review]
    # acct_gamma's only response is possible; its data was named only by r-a2's temporal
    # candidates. acct_beta is notified (page-level reads), so its own candidate read by r-a2
    # adds no review row.
    assert got == [("acct_gamma", "recipient", 1, "possible"), ("acct_gamma", "source", 1, "low")]
    assert all(r.reason and r.evidence for r in scope.review)
    assert con.execute("SELECT count(*) FROM findings_review").fetchone() == (2,)


def test_a_notified_recipients_possible_responses_are_listed_for_review(tmp_path):
    # acct_alpha is notified for r-a1 and r-a2; its possible r-a0 is not in its notice, so it
    # is on the review list with a reason that says so. acct_gamma's row keeps its own reason.
    affected = AFFECTED + [("r-a0", "possible", "latency_too_good", None)]
    case, con = build(tmp_path, affected=affected)
    scope = scope_case(con, case)
    assert ("acct_alpha", "recipient", 2) in [
        (n.tenant_id, n.role, n.responses) for n in scope.notifications
    ]
    got = {(r.tenant_id, r.role): r for r in scope.review}
    alpha = got[("acct_alpha", "recipient")]
    assert (alpha.responses, alpha.first_at, alpha.confidence) == (1, at(9), "possible")
    assert alpha.reason.startswith("possible verdicts beside its notified responses")
    assert alpha.evidence == "signals: latency_too_good"
    assert got[("acct_gamma", "recipient")].reason.startswith("only possible verdicts")


def test_excluded_recipients_possible_and_own_data_are_not_notified(standard):
    _, _, scope = standard
    # Researcher and internal responses are excluded; acct_delta was read only by a "possible"
    # response; acct_internal's own request read by r-x1 is our data; r-a1 reading acct_alpha's
    # own earlier request is not cross-tenant.
    assert {"acct_researcher", "acct_internal", "acct_delta"}.isdisjoint(scope.tenants)
    assert [n.tenant_id for n in scope.sources] == [TRAVERSAL, "acct_beta"]
    assert "acct_alpha" not in {n.tenant_id for n in scope.sources}


def test_source_read_only_by_excluded_recipient_is_still_notified(standard):
    # ../../etc/passwd's request was read only by the researcher's r-res2.
    _, _, scope = standard
    assert [(n.tenant_id, n.responses) for n in scope.sources if n.tenant_id == TRAVERSAL] == [
        (TRAVERSAL, 1)
    ]


def test_notifications_table_matches_the_scope(standard):
    _, con, scope = standard
    table = con.execute(
        "SELECT tenant_id, role, responses, first_at, last_at, confidence "
        "FROM findings_notifications ORDER BY tenant_id, role"
    ).fetchall()
    assert [tuple(r) for r in table] == rows(scope)


def test_recipient_confidence_is_the_best_verdict(tmp_path):
    affected = [(rid, "likely", "over_pool", x) for rid, _, _, x in AFFECTED]
    case, con = build(tmp_path, affected=affected)
    alpha = [n for n in scope_case(con, case).recipients if n.tenant_id == "acct_alpha"]
    assert [(n.responses, n.confidence) for n in alpha] == [(2, "likely")]


def test_rescoping_replaces_the_table(tmp_path):
    case, con = build(tmp_path)
    scope_case(con, case)
    con.execute("UPDATE findings_affected SET verdict = 'possible'")
    scope = scope_case(con, case)
    assert scope.recipients == ()
    assert scope.sources == ()
    assert con.execute("SELECT count(*) FROM findings_notifications").fetchone() == (0,)


def test_missing_findings_is_a_clear_error(tmp_path):
    from forensics.db import connect

    con = connect(tmp_path / "empty.duckdb")
    with pytest.raises(ForensicsError, match="forensics detect"):
        scope_case(con, None)


def test_source_confidence_is_the_best_attribution_in_full_order(tmp_path):
    from forensics.db import connect, publish_findings
    from forensics.schema import FINDINGS_DDL

    con = connect(tmp_path / "c.duckdb")
    for ddl in FINDINGS_DDL.values():
        con.execute(ddl)
    con.execute(
        "INSERT INTO findings_affected (request_id, tenant_id, received_at, verdict)"
        " VALUES ('v', 'tv', '2026-09-01T10:00:00Z', 'confirmed')"
    )
    for src, confidence in [
        ("s1", "medium"),
        ("s2", "very_low"),
        ("s3", "low"),
        ("s3b", "very_low"),
    ]:
        tenant = "t3" if src.startswith("s3") else f"t{src[1]}"
        con.execute(
            "INSERT INTO findings_exposures (recipient_request_id, recipient_tenant_id,"
            " source_request_id, source_tenant_id, method, tokens, confidence)"
            " VALUES ('v', 'tv', $s, $t, 'temporal', 64, $c)",
            {"s": src, "t": tenant, "c": confidence},
        )
    scope = scope_case(con)
    # Only page-level confidences notify; the rest are candidates, each at its best confidence.
    assert {n.tenant_id: n.confidence for n in scope.sources} == {"t1": "medium"}
    assert {r.tenant_id: r.confidence for r in scope.review} == {"t2": "very_low", "t3": "low"}
    # A notice ranks each of its own requests the same way.
    from forensics.report.notices import notice_context

    con.execute(
        "INSERT INTO findings_exposures (recipient_request_id, recipient_tenant_id,"
        " source_request_id, source_tenant_id, method, tokens, confidence)"
        " VALUES ('v', 'tv', 's1', 't1', 'temporal', 64, 'very_low')"
    )
    scope = scope_case(con)
    publish_findings(con)  # as detection does: the notices read the published findings
    rows = notice_context(con, scope, "t1")["source"]["requests"]
    assert [(r["request_id"], r["confidence"]) for r in rows] == [("s1", "medium")]
