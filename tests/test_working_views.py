"""Detection's working views on small cases: how legs meet their requests, and log silences."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from importlib.resources import files

from forensics.case import load_case
from forensics.db import connect, insert_rows
from forensics.detect import case_parameters, detect_case, prepare


def _case(tmp_path):
    path = tmp_path / "case.toml"
    path.write_text('[incident]\nid = "INC-W"\ncontext_length = 1048576\n')
    case = load_case(path)
    return case, connect(case.database)


def _req(rid, room):
    return {
        "request_id": rid,
        "tenant_id": "t1",
        "received_at": "2026-08-28T10:00:00Z",
        "prompt_tokens": 1000,
        "http_status": 200,
        "bootstrap_room": room,
    }


def _leg(rid, role, room, second):
    return {
        "request_id": rid,
        "role": role,
        "node": "p0" if role == "prefill" else "d0",
        "started_at": f"2026-08-28T10:00:{second:02d}Z",
        "bootstrap_room": room,
    }


def test_legs_meet_their_request_by_rid_else_room_and_the_rest_stand_alone(tmp_path):
    case, con = _case(tmp_path)
    insert_rows(
        con,
        "requests",
        [_req("c1", "1"), _req("c2", "2"), _req("c3", "5"), _req("c3b", "5")],
    )
    insert_rows(
        con,
        "engine_legs",
        [
            _leg("c1", "prefill", "1", 1),  # by rid
            _leg("d-x", "decode", "1", 2),  # another rid, c1's room
            _leg("d-x", "prefill", None, 3),  # no room, but a rid a matched leg carries
            _leg("c2", "decode", "77", 4),  # the rid wins over a room naming nothing
            _leg("d-5", "decode", "5", 5),  # a room two requests share: both
            _leg("e-1", "decode", "9", 6),  # nothing names it
            _leg("e-2", "prefill", None, 7),  # nor this one
        ],
    )
    prepare(con, case_parameters(case))
    matched = con.execute(
        "SELECT client_request_id, request_id, role FROM client_legs ORDER BY ALL"
    ).fetchall()
    # Every leg, with no client request for those no rid or room matched (d-x's prefill leg
    # carries the rid of a leg the room matched: it stands with neither).
    assert matched == [
        ("c1", "c1", "prefill"),
        ("c1", "d-x", "decode"),
        ("c2", "c2", "decode"),
        ("c3", "d-5", "decode"),
        ("c3b", "d-5", "decode"),
        (None, "d-x", "prefill"),
        (None, "e-1", "decode"),
        (None, "e-2", "prefill"),
    ]
    # A join on the client request leaves those out.
    assert con.execute(
        "SELECT count(*) FROM matched_legs l JOIN requests r ON r.request_id = l.client_request_id"
    ).fetchone() == (5,)
    orphans = con.execute("SELECT request_id, engine_key FROM orphan_legs ORDER BY 1").fetchall()
    assert orphans == [("e-1", "room:9"), ("e-2", "rid:e-2")]
    # The engine requests standing in for a missing client record: one per engine key.
    assert con.execute("SELECT request_id FROM engine_requests ORDER BY 1").fetchall() == [
        ("e-1",),
        ("e-2",),
    ]


def test_legs_with_no_client_log_are_all_engine_requests(tmp_path):
    case, con = _case(tmp_path)
    insert_rows(
        con,
        "engine_legs",
        [
            _leg("e-1", "prefill", "9", 1),
            _leg("e-1b", "decode", "9", 2),
            _leg("e-2", "decode", None, 3),
        ],
    )
    prepare(con, case_parameters(case))
    assert con.execute(
        "SELECT count(*) FROM client_legs WHERE client_request_id IS NOT NULL"
    ).fetchone() == (0,)
    assert con.execute("SELECT engine_key FROM engine_requests ORDER BY 1").fetchall() == [
        ("rid:e-2",),
        ("room:9",),
    ]


def test_silences_are_the_ones_a_row_by_row_reading_finds(tmp_path):
    """Silences are found over buckets of time, not rows: on a series built around the gap
    (just under, at and just over it, sub-millisecond steps, bursts), the same silences as
    reading every row in order."""
    case, con = _case(tmp_path)
    gap = case_parameters(case)["coverage_gap_s"]
    rng = random.Random(7)
    start = datetime(2026, 8, 28, tzinfo=UTC)
    steps_us = [1, 999, 1000, 1001, int(gap * 1e6) - 1000, int(gap * 1e6) - 1, int(gap * 1e6)]
    steps_us += [int(gap * 1e6) + 1, int(gap * 1e6) + 1000, int(gap * 2.5e6), 0]
    legs = []
    for node in ("d0", "d1", "d2"):
        at = start
        for i in range(400):
            step = rng.choice(steps_us) if rng.random() < 0.3 else rng.randrange(1, 50_000_000)
            at += timedelta(microseconds=step)
            legs.append(
                {
                    "request_id": f"{node}-{i}",
                    "role": "decode",
                    "node": node,
                    "started_at": at.isoformat().replace("+00:00", "Z"),
                }
            )
    insert_rows(con, "engine_legs", legs)
    detect_case(con, case)
    found = con.execute(
        "SELECT scope, node, from_at, to_at, gap_s FROM coverage_candidates ORDER BY ALL"
    ).fetchall()
    row_by_row = con.execute(
        """SELECT scope, node, from_at, to_at, date_diff('millisecond', from_at, to_at) / 1000.0
           FROM (SELECT scope, node, "at" AS to_at,
                        lag("at") OVER (PARTITION BY scope, node ORDER BY "at") AS from_at
                 FROM coverage_series)
           WHERE date_diff('millisecond', from_at, to_at) / 1000.0 > $gap
           ORDER BY ALL""",
        {"gap": gap},
    ).fetchall()
    assert len(row_by_row) > 20
    assert found == row_by_row


def test_decode_timeline_takes_decode_legs_else_the_client_record(tmp_path):
    case, con = _case(tmp_path)

    def req(rid, decode_node="d0", status=200, **kw):
        return {
            **_req(rid, None),
            "decode_node": decode_node,
            "http_status": status,
            "e2e_ms": 2000.0,
            "dp_rank": 1,
            **kw,
        }

    def decode(rid, second, **kw):
        return {
            **_leg(rid, "decode", None, second),
            "finished_at": f"2026-08-28T10:01:{second:02d}Z",
            "reserved_tokens": 900,
            "dp_rank": 0,
            **kw,
        }

    insert_rows(
        con,
        "requests",
        [
            req("leg"),  # its decode leg
            req("none"),  # no leg: the client record's times
            req("empty", prompt_tokens=0),  # a leg that reserved nothing: the client record
            req("failed", status=500),  # its only decode leg failed, and so did the request
            req("twice"),  # a retried decode: both legs held pages
            req("unified"),
            req("nowhere", decode_node=None),  # no decode node, no leg: nothing held
        ],
    )
    insert_rows(
        con,
        "engine_legs",
        [
            decode("leg", 1),
            decode("empty", 2, reserved_tokens=0),
            decode("failed", 3, error="KV transfer failed"),
            decode("twice", 4),
            decode("twice", 5, dp_rank=None),
            {**decode("unified", 6), "role": "unified"},
            decode("engine-only", 7),  # no client record: the engine request stands in
        ],
    )
    prepare(con, case_parameters(case))
    con.execute((files("forensics.sql") / "timeline.sql").read_text())
    rows = con.execute(
        """SELECT request_id, node, dp_rank, strftime(alloc_at, '%M:%S'),
                  strftime(free_at, '%M:%S'), prompt_tokens, source_table, size_known
           FROM decode_timeline ORDER BY ALL"""
    ).fetchall()
    assert rows == [
        ("empty", "d0", 1, "00:00", "00:02", 0, "requests", True),
        ("engine-only", "d0", 0, "00:07", "01:07", 900, "engine_legs", False),
        ("leg", "d0", 0, "00:01", "01:01", 900, "engine_legs", True),
        ("none", "d0", 1, "00:00", "00:02", 1000, "requests", True),
        ("twice", "d0", 0, "00:04", "01:04", 900, "engine_legs", True),
        ("twice", "d0", 1, "00:05", "01:05", 900, "engine_legs", True),
        ("unified", "d0", 0, "00:06", "01:06", 900, "engine_legs", True),
    ]
    # Written in replay order: each rank's rows together (node, rank), by allocation, then id.
    in_order = con.execute("SELECT request_id, dp_rank FROM decode_timeline ORDER BY rowid")
    assert in_order.fetchall() == [
        ("leg", 0),
        ("twice", 0),
        ("unified", 0),
        ("engine-only", 0),
        ("empty", 1),
        ("none", 1),
        ("twice", 1),
    ]


def _scans(node) -> set[str]:
    """The tables a plan node reads, below it included."""
    table = node.get("extra_info", {}).get("Table", "")
    found = {table.rsplit(".", 1)[-1].strip('"')} if table else set()
    for child in node.get("children", []):
        found |= _scans(child)
    return found


def _top_join(node):
    if "JOIN" in node.get("name", ""):
        return node
    for child in node.get("children", []):
        if (join := _top_join(child)) is not None:
            return join
    return None


def test_the_legs_to_requests_join_builds_on_the_requests(tmp_path):
    # DuckDB builds a hash join's table on its right side, the side it estimates smaller:
    # built on the engine legs (twice the requests), a 100M-request case ran out of memory
    # under the cap where the requests side spills. Estimates follow the tables' sizes, so the
    # case is a million requests, made in SQL.
    import json

    from forensics.detect import bind
    from forensics.detectors import load_detectors

    case, con = _case(tmp_path)
    con.execute(
        "INSERT INTO requests (request_id, tenant_id, received_at, prompt_tokens, http_status, "
        "bootstrap_room, evidence_id, source_row) SELECT 'c' || i, 't' || (i % 500), "
        "TIMESTAMPTZ '2026-08-28 00:00:00+00' + to_microseconds(i * 1000), 1000 + i % 5000, "
        "200, i::VARCHAR, 1, i FROM range(1000000) t(i)"
    )
    con.execute(
        "INSERT INTO engine_legs (request_id, role, node, started_at, input_tokens, "
        "transferred_tokens, reserved_tokens, bootstrap_room, evidence_id, source_row) "
        "SELECT 'c' || i, role, 'n' || (i % 64), "
        "TIMESTAMPTZ '2026-08-28 00:00:00+00' + to_microseconds(i * 1000), 1000 + i % 5000, "
        "1000 + i % 5000, 1000 + i % 5000, i::VARCHAR, 2, i "
        "FROM range(1000000) t(i), (VALUES ('prefill'), ('decode')) r(role)"
    )
    params = case_parameters(case)
    prepare(con, params)
    det = next(d for d in load_detectors() if d.id == "token_mismatch")
    sql = det.sql.rstrip().rstrip(";")
    for name, value in bind(det, params).items():
        sql = sql.replace(f"${name}", repr(value))
    plan = json.loads(con.execute(f"EXPLAIN (FORMAT json) {sql}").fetchall()[0][1])
    probe, build = _top_join(plan[0])["children"]
    assert "requests" in _scans(build) and "engine_legs" not in _scans(build)
    assert "engine_legs" in _scans(probe)
