"""Exclusion selectors, the exploitation assessment, log coverage and explain, on small cases."""

from __future__ import annotations

import json

import pytest

from forensics.case import load_case
from forensics.db import connect, insert_rows
from forensics.detect import detect_case
from forensics.errors import ForensicsError
from forensics.explain import explain_request

LIMIT = 681274
PREFILL = {
    "node": "p0",
    "observed_at": "2026-08-27T00:00:00Z",
    "role": "prefill",
    "max_total_num_tokens": 681280,
    "context_length": 1048576,
}


def _case(tmp_path, rules=""):
    path = tmp_path / "case.toml"
    path.write_text('[incident]\nid = "INC-A"\ncontext_length = 1048576\n' + rules)
    case = load_case(path)
    return case, connect(case.database)


def _req(rid, tenant, minute, prompt, status=200, **kw):
    return {
        "request_id": rid,
        "tenant_id": tenant,
        "prompt_tokens": prompt,
        "received_at": f"2026-08-28T10:{minute:02d}:00Z",
        "http_status": status,
        "prefill_node": "p0",
        **kw,
    }


def test_each_exclusion_selector_and_the_time_window(tmp_path):
    rules = """
[[exclusion]]
name = "keys"
api_key_ids = ["k-test"]
[[exclusion]]
name = "cidr"
client_cidrs = ["10.9.0.0/16", "2001:db8::/32"]
[[exclusion]]
name = "ua"
user_agent_regex = "^canary/"
[[exclusion]]
name = "late-tenant"
tenant_ids = ["t-late"]
start = "2026-08-28T10:30:00Z"
"""
    case, con = _case(tmp_path, rules)
    insert_rows(con, "pool_snapshots", [PREFILL])
    insert_rows(
        con,
        "requests",
        [
            _req("a", "t1", 1, 700000, api_key_id="k-test"),
            _req("b", "t2", 2, 700000, client_ip="10.9.3.4"),
            _req("c", "t3", 3, 700000, client_ip="2001:db8::7"),
            _req("d", "t4", 4, 700000, user_agent="canary/2.1"),
            _req("e", "t-late", 5, 700000),  # before the rule's window: a customer
            _req("f", "t-late", 40, 700000),
            _req("g", "t5", 6, 700000, client_ip="10.8.0.1", user_agent="curl canary/1"),
        ],
    )
    detect_case(con, case)
    marks = dict(con.execute("SELECT request_id, excluded_by FROM findings_affected").fetchall())
    assert marks == {
        "a": "keys",
        "b": "cidr",
        "c": "cidr",
        "d": "ua",
        "e": None,
        "f": "late-tenant",
        "g": None,
    }
    counts = con.execute(
        "SELECT name, requests_matched, affected_matched FROM findings_exclusions ORDER BY ordinal"
    ).fetchall()
    assert counts == [("keys", 1, 1), ("cidr", 2, 2), ("ua", 1, 1), ("late-tenant", 1, 1)]


def test_a_rule_that_matches_nothing_reports_zero(tmp_path):
    case, con = _case(tmp_path, '[[exclusion]]\nname = "nobody"\ntenant_ids = ["ghost"]\n')
    insert_rows(con, "requests", [_req("a", "t1", 1, 1000)])
    detect_case(con, case)
    assert con.execute("SELECT * EXCLUDE (reason, rule) FROM findings_exclusions").fetchall() == [
        ("nobody", 0, 0, 0, 0)
    ]


def test_exploitation_scores_probing_high_and_an_ordinary_long_prompt_low(tmp_path):
    case, con = _case(tmp_path)
    insert_rows(con, "pool_snapshots", [PREFILL])
    probes = [_req(f"p{i}", "prober", i, LIMIT + 50 + i, client_ip="203.0.113.9") for i in range(6)]
    probes += [
        _req(f"q{i}", "prober", 10 + i, LIMIT - 100 - i, client_ip="203.0.113.9") for i in range(3)
    ]
    ordinary = [_req("o1", "coder", 30, 910000, client_ip="198.51.100.1")]
    shared = [_req("s1", "other", 31, 2000, client_ip="203.0.113.9")]
    insert_rows(con, "requests", probes + ordinary + shared)
    detect_case(con, case)
    rows = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT tenant_id, level, score, reasons FROM findings_exploitation"
        ).fetchall()
    }
    assert rows["prober"][0] == "high"
    reasons = " ".join(json.loads(rows["prober"][2]))
    assert "probing both sides" in reasons and "shared with other tenants" in reasons
    assert rows["coder"][0] == "none"
    conclusion = json.loads(
        con.execute("SELECT value FROM findings_case WHERE key = 'exploitation'").fetchone()[0]
    )
    assert conclusion["level"] == "high"
    assert "prober" in " ".join(conclusion["basis"])


def test_a_harvest_is_farming_one_length_not_sampling_every_long_prompt(tmp_path):
    case, con = _case(tmp_path)
    insert_rows(con, "pool_snapshots", [PREFILL])

    def at(tenant, i, prompt):
        return {
            **_req(f"{tenant}{i}", tenant, i % 60, prompt),
            "received_at": f"2026-08-28T{i // 60:02d}:{i % 60:02d}:00Z",
        }

    # An evaluation harness sampling each of its long prompts 20 times, one of them over the
    # limit; a farmer trying three lengths, then sending the one that leaked 30 times.
    sampler = [at("sampler", 10 * i, 600_000 + 100_000 * (i // 20)) for i in range(40)]
    farmer = [at("farmer", 7 * i, n) for i, n in enumerate([600_000, 650_000, 700_000])]
    farmer += [at("farmer", 7 * i, 700_000) for i in range(3, 33)]
    insert_rows(con, "requests", sampler + farmer)
    detect_case(con, case)
    rows = dict(
        con.execute(
            "SELECT tenant_id, struct_pack(level, reasons) FROM findings_exploitation"
        ).fetchall()
    )
    assert rows["farmer"]["level"] == "high"
    assert "a harvest" in rows["farmer"]["reasons"]
    assert rows["sampler"]["level"] == "low"
    not_counted = "not counted: it sends its long prompts under the limit as often (up to 20"
    assert not_counted in rows["sampler"]["reasons"]


def test_probing_by_excluded_traffic_is_not_a_customer_exploit(tmp_path):
    case, con = _case(tmp_path, '[[exclusion]]\nname = "researcher"\ntenant_ids = ["prober"]\n')
    insert_rows(con, "pool_snapshots", [PREFILL])
    insert_rows(
        con,
        "requests",
        [_req(f"p{i}", "prober", i, LIMIT + i) for i in range(6)]
        + [_req(f"q{i}", "prober", 10 + i, LIMIT - 10 - i) for i in range(2)],
    )
    detect_case(con, case)
    conclusion = json.loads(
        con.execute("SELECT value FROM findings_case WHERE key = 'exploitation'").fetchone()[0]
    )
    assert conclusion["level"] == "none"
    assert "excluded traffic" in conclusion["conclusion"]


def test_coverage_reports_holes_not_quiet_hours_and_one_sided_requests(tmp_path):
    case, con = _case(tmp_path)
    insert_rows(
        con,
        "requests",
        [
            _req("a", "t1", 0, 1000),
            _req("b", "t1", 1, 1000),
            {**_req("m", "t1", 0, 1000), "received_at": "2026-08-28T11:30:00Z"},
            {**_req("c", "t1", 0, 1000), "received_at": "2026-08-28T13:00:00Z"},
            # A quiet night on p1: no client request routed there either, so not a hole.
            {**_req("n1", "t2", 0, 1000), "prefill_node": "p1"},
            {
                **_req("n2", "t2", 0, 1000),
                "prefill_node": "p1",
                "received_at": "2026-08-28T15:00:00Z",
            },
        ],
    )
    legs = [
        ("a", "p0", "10:00:01"),
        ("c", "p0", "13:00:01"),
        ("zz", "p0", "13:30:00"),
        ("n1", "p1", "10:00:01"),
        ("n2", "p1", "15:00:01"),
    ]
    insert_rows(
        con,
        "engine_legs",
        [
            {"request_id": r, "role": "prefill", "node": n, "started_at": f"2026-08-28T{t}Z"}
            for r, n, t in legs
        ],
    )
    detect_case(con, case)
    rows = {
        (r[0], r[1]): r[2:]
        for r in con.execute(
            "SELECT scope, node, rows, gap_count, largest_gap_s FROM findings_coverage"
        ).fetchall()
    }
    # p0's log is silent 10:00-13:00 while the client sent m (11:30) to it: one hole.
    assert rows[("engine_legs:prefill", "p0")][:3] == (3, 1, 10800.0)
    # p1 is silent 10:00-15:00 with nothing routed to it: quiet, not a hole.
    assert rows[("engine_legs:prefill", "p1")][:2] == (2, 0)
    # The client log is silent 11:30-13:00 and 13:00-15:00; engine work at 13:30 sits in
    # the second silence only.
    assert rows[("requests", None)][:2] == (6, 1)
    assert rows[("client_only", "p0")][0] == 2  # b and m have no engine leg
    assert rows[("engine_only", "p0")][0] == 1  # zz has no client record
    stated = json.loads(
        con.execute("SELECT value FROM findings_case WHERE key = 'coverage'").fetchone()[0]
    )
    assert stated["level"] == "incomplete"
    assert (stated["holes"], stated["client_only"], stated["engine_only"]) == (2, 2, 1)


def test_coverage_without_engine_logs_counts_no_request_as_missing_its_legs(tmp_path):
    """With no engine log loaded at all, no request is one-sided: there is no engine side to
    miss it, and coverage counts no client_only or missing-leg rows."""
    case, con = _case(tmp_path)
    insert_rows(con, "requests", [_req("a", "t1", 0, 1000), _req("b", "t1", 1, 1000)])
    detect_case(con, case)
    scopes = {r[0] for r in con.execute("SELECT scope FROM findings_coverage").fetchall()}
    assert scopes == {"requests"}
    assert con.execute("SELECT count(*) FROM coverage_missing_legs").fetchone() == (0,)


def _coverage_rows(case, con, legs) -> dict[tuple, int]:
    """Load ``legs`` (request, role, node, time on 28 August), detect, and return the rows
    counted per (scope, node) of findings_coverage."""
    insert_rows(
        con,
        "engine_legs",
        [
            {"request_id": r, "role": role, "node": n, "started_at": f"2026-08-28T{t}Z"}
            for r, role, n, t in legs
        ],
    )
    detect_case(con, case)
    return {
        (r[0], r[1]): r[2]
        for r in con.execute("SELECT scope, node, rows FROM findings_coverage").fetchall()
    }


def test_coverage_counts_a_leg_of_another_role_as_logged_but_not_as_either_side(tmp_path):
    """A request whose only engine leg has a role that is neither prefill, decode nor unified
    was seen by the engine (not client_only), yet the prefill leg of its node is missing."""
    case, con = _case(tmp_path)
    insert_rows(con, "requests", [_req("r", "t1", 0, 1000), _req("none", "t1", 1, 1000)])
    legs = [("r", "router", "g0", "10:00:01")]
    rows = _coverage_rows(case, con, legs)
    assert rows[("client_only", "p0")] == 1  # "none" has no leg at all
    assert rows[("leg_missing:prefill", "p0")] == 1  # "r" has a leg, not its prefill one
    assert con.execute("SELECT request_id, role FROM coverage_missing_legs").fetchall() == [
        ("r", "prefill")
    ]


def test_coverage_states_a_node_whose_whole_log_is_missing(tmp_path):
    """A decode node's log left out entirely has no silence to find: its requests still have
    their prefill legs, so only the legs missing on the node they were routed to tell."""
    case, con = _case(tmp_path)
    routed = {"decode_node": "d1"}
    insert_rows(
        con,
        "requests",
        [
            _req("ok", "t1", 0, 1000, decode_node="d0"),
            _req("u", "t1", 1, 1000, prefill_node="u0", decode_node="u0"),
            _req("x1", "t1", 2, 1000, **routed),
            _req("x2", "t2", 3, 1000, **routed),
        ],
    )
    legs = [
        ("ok", "prefill", "p0", "10:00:01"),
        ("ok", "decode", "d0", "10:00:02"),
        ("u", "unified", "u0", "10:01:01"),  # one unified leg serves both roles
        ("x1", "prefill", "p0", "10:02:01"),
        ("x2", "prefill", "p0", "10:03:01"),
    ]
    rows = _coverage_rows(case, con, legs)
    assert rows[("leg_missing:decode", "d1")] == 2
    assert not [k for k in rows if k[0].startswith("leg_missing") and k[1] != "d1"]
    stated = json.loads(
        con.execute("SELECT value FROM findings_case WHERE key = 'coverage'").fetchone()[0]
    )
    assert stated["level"] == "incomplete"
    assert stated["missing_legs"] == 2
    assert "2 requests missing an engine leg (the prefill or decode log" in stated["statement"]


def test_coverage_states_a_decode_log_missing_from_engine_logs_alone(tmp_path):
    """With no client log nothing says where a request was routed, but a prefill that completed
    always hands its request to a decode node: a completed prefill leg with no decode leg
    anywhere means a decode log is missing. A rejected prefill may stop there: not counted."""
    case, con = _case(tmp_path)
    legs = [
        ("both", "prefill", "p0", "10:00:01", None),
        ("both", "decode", "d0", "10:00:02", None),
        ("lost", "prefill", "p0", "10:01:01", None),
        ("refused", "prefill", "p0", "10:02:01", "Input length (9 tokens) exceeds the maximum"),
    ]
    insert_rows(
        con,
        "engine_legs",
        [
            {
                "request_id": r,
                "role": role,
                "node": n,
                "started_at": f"2026-08-28T{t}Z",
                "error": error,
            }
            for r, role, n, t, error in legs
        ],
    )
    detect_case(con, case)
    rows = con.execute(
        "SELECT scope, node, rows FROM findings_coverage WHERE scope LIKE 'leg_missing%'"
    ).fetchall()
    assert rows == [("leg_missing:decode", None, 1)]
    assert con.execute("SELECT request_id FROM coverage_missing_legs").fetchall() == [("lost",)]
    stated = json.loads(
        con.execute("SELECT value FROM findings_case WHERE key = 'coverage'").fetchone()[0]
    )
    assert stated["missing_legs"] == 1


def test_explain_gathers_signals_legs_and_exposures(tmp_path):
    case, con = _case(tmp_path)
    insert_rows(con, "pool_snapshots", [PREFILL])
    insert_rows(con, "requests", [_req("v", "t1", 1, 700000, bootstrap_room="42")])
    insert_rows(
        con,
        "engine_legs",
        [
            {
                "request_id": "rid-on-prefill",
                "bootstrap_room": "42",
                "role": "prefill",
                "node": "p0",
                "started_at": "2026-08-28T10:01:00.1Z",
                "input_tokens": 1,
                "error": "Input length (700000 tokens) exceeds the maximum allowed length (681274"
                " tokens). Use a shorter input or enable --allow-auto-truncate.",
            }
        ],
    )
    detect_case(con, case)
    e = explain_request(con, "v")
    assert e.verdict["verdict"] == "confirmed"
    assert [s["signal"] for s in e.signals] == ["over_pool", "prefill_rejected", "token_mismatch"]
    assert e.legs[0]["request_id"] == "rid-on-prefill"
    assert all(s["evidence"] for s in e.signals)
    with pytest.raises(ForensicsError, match="'nope' is not in this case"):
        explain_request(con, "nope")


def test_over_pool_alone_is_only_possible_when_prefill_processed_the_whole_prompt(tmp_path):
    case, con = _case(tmp_path, "[detection]\ndefault_pool_tokens = 681280\n")
    insert_rows(con, "requests", [_req("whole", "t1", 1, 700000), _req("silent", "t2", 2, 700000)])
    insert_rows(
        con,
        "engine_legs",
        [
            {
                "request_id": "whole",
                "role": "prefill",
                "node": "p0",
                "started_at": "2026-08-28T10:01:00.1Z",
                "input_tokens": 700000,
            }
        ],
    )
    detect_case(con, case)
    rows = dict(
        con.execute(
            "SELECT request_id, verdict || ':' || coalesce(note, '') FROM findings_affected"
        ).fetchall()
    )
    assert rows["silent"] == "likely:"  # no leg says otherwise: notify
    assert rows["whole"].startswith("possible:its prefill leg processed the whole prompt")
