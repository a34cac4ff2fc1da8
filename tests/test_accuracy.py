"""End to end against ground truth: simulate a case, ingest it, detect, compare with truth/.

The simulator models the mechanism (allocator, writers, bug path) and writes the answer; these
tests hold detection to it, with complete logs and with evidence taken away.
"""

from __future__ import annotations

import shutil

import pytest

from forensics.case import load_case
from forensics.db import connect
from forensics.detect import detect_case
from forensics.evaluate import evaluate
from forensics.ingest import ingest_case
from forensics.scope import scope_case
from forensics.simulate import simulate_case


@pytest.fixture(scope="module", params=[(3, 6000), (11, 9000)], ids=["seed3", "seed11"])
def loaded_case(request, tmp_path_factory):
    seed, n = request.param
    folder = tmp_path_factory.mktemp(f"sim{seed}")
    simulate_case(folder, requests=n, seed=seed, kv_allocations=True)
    case = load_case(folder / "case.toml")
    result = ingest_case(case)
    assert not result.errors
    return case


def _fresh(case, tmp_path):
    """A private copy of the loaded database, so each test may take evidence away."""
    copy = tmp_path / "case.duckdb"
    shutil.copy(case.database, copy)
    return connect(copy)


def test_complete_logs_find_every_affected_response_and_exact_sources(loaded_case, tmp_path):
    con = _fresh(loaded_case, tmp_path)
    con.execute("DELETE FROM kv_allocations")  # allocator replay, not the log
    detect_case(con, loaded_case)
    scope_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert ev.notified_sources.precision == ev.notified_sources.recall == 1.0, ev.lines()
    assert ev.affected.true_positive > 0
    assert ev.affected.recall == 1.0 and ev.affected.precision == 1.0, ev.lines()
    assert ev.exclusions_exact, ev.exclusion_mismatches
    assert ev.methods.keys() == {"allocator_replay"}
    assert ev.source_pairs.recall == 1.0 and ev.source_pairs.precision == 1.0, ev.lines()
    coverage = con.execute("SELECT value FROM findings_case WHERE key = 'coverage'").fetchone()
    assert '"level": "complete"' in coverage[0]


def test_allocation_log_gives_exact_sources(loaded_case, tmp_path):
    con = _fresh(loaded_case, tmp_path)
    detect_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert ev.methods.keys() == {"allocation_log"}
    assert ev.source_pairs.recall == 1.0 and ev.source_pairs.precision == 1.0, ev.lines()
    assert set(con.execute("SELECT DISTINCT confidence FROM findings_exposures").fetchall()) == {
        ("exact",)
    }


def test_temporal_only_keeps_every_source_tenant_ranked(loaded_case, tmp_path):
    con = _fresh(loaded_case, tmp_path)
    con.execute("DELETE FROM kv_allocations")
    con.execute("DELETE FROM pool_snapshots WHERE role = 'decode'")
    summary = detect_case(con, loaded_case)
    scope_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert ev.methods.keys() == {"temporal"}
    assert ev.affected.recall == 1.0
    assert ev.source_pairs.recall == 1.0 and ev.source_tenants.recall == 1.0, ev.lines()
    # Candidates only: nobody is told their data leaked, every true source is on review.
    assert ev.notified_sources.true_positive == ev.notified_sources.false_positive == 0
    assert ev.candidate_sources.recall >= 0.95, ev.lines()
    assert any("no pool snapshot" in w for w in summary.warnings)
    ranks = con.execute(
        """SELECT count(*) = count(DISTINCT (recipient_request_id, rank)) AND min(rank) = 1
           FROM findings_exposures"""
    ).fetchone()[0]
    assert ranks


@pytest.mark.parametrize("removed", ["engine_legs", "pool_snapshots", "placement"])
def test_each_evidence_kind_removed_keeps_recall(loaded_case, tmp_path, removed):
    con = _fresh(loaded_case, tmp_path)
    con.execute("DELETE FROM kv_allocations")
    if removed == "placement":
        con.execute("UPDATE requests SET prefill_node = NULL, decode_node = NULL, dp_rank = NULL")
    else:
        con.execute(f"DELETE FROM {removed}")
    summary = detect_case(con, loaded_case)
    scope_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert summary.warnings
    assert ev.affected.recall == 1.0, ev.lines()
    if removed != "placement":
        # Without snapshots the default pool applies everywhere; the prefill legs show which
        # long prompts were processed whole, so none of them is notified.
        assert ev.affected.precision == 1.0, ev.lines()
    assert ev.exclusions_exact
    if removed == "engine_legs":
        # The replay runs from client times: a request allocates at its arrival, or, when its
        # rank's pool cannot hold it, waits first in, first out for the releases that make room
        # (the engine's preallocation queue). It names sources at medium; nobody is told of a
        # leak that did not happen. Before the queue was modelled, long turns close together
        # drifted the replay (seed 3: 14 of 93 true sources on review only, 6 wrong candidates).
        assert ev.notified_sources.precision == 1.0, ev.lines()
        assert ev.source_tenants.recall == 1.0, ev.lines()
        assert ev.notified_sources.recall == 1.0, ev.lines()
        assert ev.source_pairs.precision == 1.0, ev.lines()
        assert not any("did not fit the replayed pool" in w for w in summary.warnings)
    else:
        assert ev.source_tenants.recall == 1.0 or not ev.methods, ev.lines()


def test_exploitation_flags_the_researcher_and_no_customer(loaded_case, tmp_path):
    import json

    con = _fresh(loaded_case, tmp_path)
    detect_case(con, loaded_case)
    levels = dict(con.execute("SELECT tenant_id, level FROM findings_exploitation").fetchall())
    assert levels["acct_researcher"] == "high"
    customers = {
        t: lvl for t, lvl in levels.items() if t not in ("acct_researcher", "acct_internal")
    }
    assert all(lvl in ("none", "low") for lvl in customers.values()), customers
    conclusion = json.loads(
        con.execute("SELECT value FROM findings_case WHERE key = 'exploitation'").fetchone()[0]
    )
    assert conclusion["level"] == "none" and "excluded traffic" in conclusion["conclusion"]


def test_missing_client_records_keep_their_decode_legs_in_the_replay(loaded_case, tmp_path):
    con = _fresh(loaded_case, tmp_path)
    con.execute("DELETE FROM kv_allocations")
    truth = loaded_case.folder / "truth" / "affected.csv"
    con.execute(
        """DELETE FROM requests WHERE hash(request_id) % 10 = 0
           AND request_id NOT IN (SELECT request_id FROM read_csv($truth))""",
        {"truth": str(truth)},
    )
    summary = detect_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert ev.affected.recall == 1.0 and ev.affected.precision == 1.0
    drift = [w for w in summary.warnings if "no count of generated tokens" in w]
    assert drift and all("sized by how long it held its pages" in w for w in drift), drift
    # Every tenant whose client record survives is still named as a source, and nearly every
    # (response, tenant) pair: the lost requests' pages are not wrongly credited to the tenant
    # who held them before. Their generated tokens are unknown, so the replay after them is
    # approximate: each is guessed from how long its decode leg held its pages
    # (replay.guess_generated). Counted as none, they left the replayed free list short: 8 and
    # 22 pairs missed here, about one request pair in 75 at a notified confidence wrong.
    knowable = set(
        con.execute(
            """SELECT t.recipient_request_id, t.source_tenant_id
           FROM read_csv($x) t JOIN requests r ON r.request_id = t.source_request_id""",
            {"x": str(loaded_case.folder / "truth" / "exposures.csv")},
        ).fetchall()
    )
    found = set(
        con.execute(
            "SELECT recipient_request_id, source_tenant_id FROM findings_exposures"
        ).fetchall()
    )
    assert len(knowable & found) / len(knowable) >= 0.995
    assert {t for _, t in knowable} <= {t for _, t in found}
    notified_pairs = con.execute(
        """SELECT DISTINCT recipient_request_id, source_request_id FROM findings_exposures
           WHERE method = 'allocator_replay' AND confidence IN ('exact', 'high', 'medium')"""
    ).fetchall()
    true_request_pairs = set(
        con.execute(
            "SELECT recipient_request_id, source_request_id FROM read_csv($x)",
            {"x": str(loaded_case.folder / "truth" / "exposures.csv")},
        ).fetchall()
    )
    wrong = [p for p in notified_pairs if p not in true_request_pairs]
    assert len(wrong) <= 0.005 * len(notified_pairs), len(wrong)
    # The replayed pairs stay mostly right; the temporal candidates that complete them are
    # marked low / very_low.
    truth_pairs = set(
        con.execute(
            "SELECT recipient_request_id, source_tenant_id FROM read_csv($x)",
            {"x": str(loaded_case.folder / "truth" / "exposures.csv")},
        ).fetchall()
    )
    replayed = set(
        con.execute(
            """SELECT recipient_request_id, source_tenant_id FROM findings_exposures
           WHERE method = 'allocator_replay' AND source_tenant_id IS NOT NULL"""
        ).fetchall()
    )
    assert len(replayed & truth_pairs) / len(replayed) > 0.9
    assert {
        c
        for (c,) in con.execute(
            "SELECT DISTINCT confidence FROM findings_exposures WHERE method = 'temporal'"
        ).fetchall()
    } <= {"low", "very_low"}
    # Pages last written by a request the client log lost are still attributed, to its
    # engine request id with an unknown tenant, instead of to whoever held them before.
    unknown = con.execute(
        "SELECT count(*) FROM findings_exposures WHERE source_tenant_id IS NULL"
    ).fetchone()[0]
    assert unknown > 0
    coverage = con.execute("SELECT value FROM findings_case WHERE key = 'coverage'").fetchone()
    assert '"level": "incomplete"' in coverage[0]


def test_engine_records_alone_find_every_affected_response(loaded_case, tmp_path):
    """The client log is missing: the engines' own records still prove every exposure."""
    import json

    con = _fresh(loaded_case, tmp_path)
    con.execute("DELETE FROM kv_allocations")
    con.execute("DELETE FROM requests")
    summary = detect_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert ev.affected.recall == 1.0 and ev.affected.precision == 1.0, ev.lines()
    # Tenants are unknown: nobody can be named, so nobody is notified, and every affected
    # response waits on the review list for its tenant to be mapped.
    scope = scope_case(con, loaded_case)
    assert scope.notifications == ()
    unknown = [r for r in scope.review if r.tenant_id is None and r.role == "recipient"]
    assert [r.responses for r in unknown] == [summary.affected]
    facts = dict(con.execute("SELECT key, value FROM findings_case").fetchall())
    basis = json.loads(facts["evidence_basis"])
    assert basis["missing"] == ["requests"] and basis["unknown_tenant_responses"] > 0
    assert "engine records alone" in basis["caveats"]["affected"]
    exploitation = json.loads(facts["exploitation"])
    assert exploitation["level"] == "unknown"
    assert exploitation["conclusion"].startswith("Cannot be assessed")
    assert any("No client requests" in w for w in summary.warnings)


def test_tenant_labels_on_engine_records_name_the_recipients(loaded_case, tmp_path):
    """With a tenant label on the legs (e.g. a custom request label), engine-only victims are
    named and notified."""
    con = _fresh(loaded_case, tmp_path)
    con.execute("DELETE FROM kv_allocations")
    con.execute(
        """UPDATE engine_legs l SET extra = json_object('tenant_id', r.tenant_id)
           FROM requests r WHERE r.request_id = l.request_id"""
    )
    con.execute("DELETE FROM requests")
    detect_case(con, loaded_case)
    ev = evaluate(con, loaded_case.folder / "truth")
    assert ev.affected.recall == 1.0 and ev.affected.precision == 1.0, ev.lines()
    truth = {
        r[0]
        for r in con.execute(
            "SELECT DISTINCT tenant_id FROM read_csv($t, all_varchar = true)"
            " WHERE excluded_by IS NULL",
            {"t": str(loaded_case.folder / "truth" / "affected.csv")},
        ).fetchall()
    }
    found = {
        r[0]
        for r in con.execute(
            "SELECT DISTINCT tenant_id FROM findings_affected WHERE notified_verdict(verdict)"
            " AND excluded_by IS NULL"
        ).fetchall()
    }
    assert found == truth
    assert ev.exclusions_exact, ev.exclusion_mismatches


@pytest.mark.parametrize("seed", [2, 5, 13, 21])
def test_every_prober_is_high_and_no_benign_customer_above_low(seed, tmp_path):
    """Realistic long-context customers (real conversation sessions, agents, a document
    re-asked) next to one prober of each strategy: the assessment must tell them apart."""
    from forensics.evaluate import evaluate_exploitation

    strategies = ("binary_search", "sweep", "repeat", "slow")
    folder = tmp_path / "case"
    simulate_case(folder, requests=30_000, seed=seed, probers=strategies)
    case = load_case(folder / "case.toml")
    ingest_case(case)
    con = connect(case.database)
    detect_case(con, case)
    rows, conclusion = evaluate_exploitation(con, folder / "truth")
    assert [(r.tenant_id, r.profile, r.strategy, r.level) for r in rows if r.wrong] == []
    probers = [r for r in rows if r.customer and r.deliberate]
    assert sorted(r.strategy for r in probers) == sorted(strategies)
    assert f"indicated for {len(probers)} customer tenant(s)" in conclusion["conclusion"]
    # The realistic heavy users were there to be judged (and none was rated above low).
    assert {r.profile for r in rows if r.level == "low"} & {"longctx", "agentic", "docqa"}
