"""What the evidence can support: each missing kind and what it costs the headline figures."""

from __future__ import annotations

import pytest

from forensics.basis import evidence_basis
from forensics.db import connect, insert_rows
from forensics.schema import FINDINGS_DDL

REQUEST = {
    "request_id": "r1",
    "tenant_id": "t1",
    "received_at": "2026-09-01T10:00:00Z",
    "prompt_tokens": 10,
    "http_status": 200,
}
LEGS = [
    {"request_id": "r1", "role": "prefill", "node": "p0", "started_at": "2026-09-01T10:00:00Z"},
    {"request_id": "r1", "role": "decode", "node": "d0", "started_at": "2026-09-01T10:00:01Z"},
]
PREFILL = {
    "node": "p0",
    "observed_at": "2026-09-01T00:00:00Z",
    "max_total_num_tokens": 1000,
    "role": "prefill",
}
DECODE = {
    "node": "d0",
    "observed_at": "2026-09-01T00:00:00Z",
    "max_total_num_tokens": 1000,
    "role": "decode",
}


def _db(*kinds):
    con = connect(":memory:")
    for ddl in FINDINGS_DDL.values():
        con.execute(ddl)
    rows = {"requests": [REQUEST], "engine_legs": LEGS, "prefill": [PREFILL], "decode": [DECODE]}
    for kind in kinds:
        insert_rows(con, "pool_snapshots" if kind in ("prefill", "decode") else kind, rows[kind])
    return con


def test_complete_evidence_has_no_caveat():
    basis = evidence_basis(_db("requests", "engine_legs", "prefill", "decode"))
    assert basis.complete and basis.can_clear and basis.caveats == {} and basis.headline() == ""


def test_nothing_loaded_is_never_an_all_clear():
    basis = evidence_basis(_db("prefill", "decode"))
    assert not basis.can_clear
    assert basis.missing == ["requests", "engine_legs"]
    assert basis.caveats["affected"].startswith("Cannot be determined")
    assert "not that nothing happened" in basis.caveats["affected"]


@pytest.mark.parametrize(
    "present,missing,figure,phrase",
    [
        (("engine_legs", "prefill", "decode"), "requests", "exploitation", "Cannot be assessed"),
        (("engine_legs", "prefill", "decode"), "requests", "affected", "engine records alone"),
        (("requests", "prefill", "decode"), "engine_legs", "affected", "no verdict is confirmed"),
        (("requests", "engine_legs", "decode"), "prefill_snapshots", "affected", "default_pool"),
        (("requests", "engine_legs", "prefill"), "decode_snapshots", "sources", "review list"),
    ],
)
def test_each_missing_kind_says_what_it_costs(present, missing, figure, phrase):
    basis = evidence_basis(_db(*present))
    assert basis.missing == [missing]
    assert phrase in basis.caveats[figure]
    assert basis.can_clear
    assert missing in basis.headline()


def test_affected_responses_without_a_tenant_are_counted():
    con = _db("engine_legs", "prefill", "decode")
    con.execute(
        "INSERT INTO findings_affected (request_id, tenant_id, verdict)"
        " VALUES ('e1', NULL, 'confirmed'), ('e2', NULL, 'possible'), ('e3', 't', 'likely')"
    )
    basis = evidence_basis(con)
    assert basis.unknown_tenant_responses == 1
    assert (
        "1 affected response has no tenant and is on the review list" in basis.caveats["recipients"]
    )


def test_one_side_of_the_engines_missing_is_named():
    con = _db("requests", "prefill", "decode")
    insert_rows(
        con,
        "engine_legs",
        [{"request_id": "r1", "role": "prefill", "node": "p0", "started_at": "2026-09-01T10:00Z"}],
    )
    basis = evidence_basis(con)
    assert basis.missing == ["decode_legs"]
    assert "cannot be shown answered" in basis.caveats["affected"]
    assert "client times" in basis.caveats["sources"]
    assert "decode_legs (the decode engines' records)" in basis.headline()


def test_without_the_client_log_the_sources_say_what_attribution_found():
    """Engine records alone: the sources' caveat counts what the legs left unknown, rather than
    claim every tenant and every generated token lost."""
    from forensics.attribution import UNSETTLED_NOTE

    con = _db("engine_legs", "prefill", "decode")
    exposure = "INSERT INTO findings_exposures (recipient_request_id, source_request_id,"
    exposure += " source_tenant_id) VALUES ('v1', ?, ?)"
    con.execute(exposure, ["s1", "t9"])
    status = "INSERT INTO findings_attribution (recipient_request_id, status) VALUES (?, ?)"
    con.execute(status, ["v1", "complete"])
    whole = evidence_basis(con).caveats["sources"]
    assert whole == (
        "Sources are engine request ids, named to a tenant only by a label on their legs;"
        " every source request read carries one. The decode legs count their generated tokens:"
        " the replay guessed none."
    )
    con.execute(exposure, ["s2", None])
    con.execute(status, ["v2", "approximate"])
    partial = evidence_basis(con).caveats["sources"]
    assert partial == (
        "Sources are engine request ids, named to a tenant only by a label on their legs;"
        " 1 source request read carries none, so its tenant is unknown. Some generated"
        " tokens are unknown without it, so the replayed pool is approximate for 1 affected"
        " response, which also gets nearby releases as review candidates."
    )
    # A response whose replay's two passes differ is approximate for another reason, and the
    # basis says which (no guess, no candidates by time).
    con.execute(
        "UPDATE findings_attribution SET note = ? WHERE recipient_request_id = 'v2'",
        [UNSETTLED_NOTE + " (the queue order ...)"],
    )
    unsettled = evidence_basis(con).caveats["sources"]
    assert unsettled.endswith(
        " its tenant is unknown. The decode legs count their generated tokens: the replay"
        " guessed none. For 1 affected response what was read depends on what the logs do not"
        " settle (the queue order of legs admitted together, or whether a response judged"
        " possible was affected): the sources of both ways are named, those of one way only a"
        " confidence step lower."
    )


def test_with_the_client_log_unnamed_and_candidate_only_sources_are_counted():
    """A client log loaded does not make every source nameable: sources read that have only
    engine records, and responses whose sources are candidates only, make the source count a
    floor, and the figure says so with the reasons attribution gave."""
    con = _db("requests", "engine_legs", "prefill", "decode")
    con.execute(
        "INSERT INTO findings_affected (request_id, tenant_id, verdict) VALUES"
        " ('v1', 't1', 'confirmed'), ('v2', 't1', 'likely'), ('v3', 't1', 'possible')"
    )
    status = "INSERT INTO findings_attribution (recipient_request_id, status, note) VALUES"
    con.execute(f"{status} ('v1', 'complete', NULL)")
    assert "sources" not in evidence_basis(con).caveats
    rank = "no dp_rank recorded and the node has several ranks"
    con.execute(f"{status} ('v2', 'candidates', ?), ('v3', 'candidates', ?)", [rank, rank])
    assert evidence_basis(con).caveats["sources"] == (
        "1 of 2 affected responses have candidate sources only, not page-level ones, so no"
        " tenant they may have read is notified as a source (the candidates are on the review"
        f" list): {rank} (1)."
    )
    con.execute(
        "INSERT INTO findings_exposures (recipient_request_id, source_request_id,"
        " source_tenant_id) VALUES ('v1', 's1', 't2'), ('v1', 's2', NULL)"
    )
    assert (
        evidence_basis(con)
        .caveats["sources"]
        .startswith(
            "1 source request read has only engine records, no client record and no tenant label:"
            " their tenants are unknown, so this count is a floor. 1 of 2 affected responses"
        )
    )
