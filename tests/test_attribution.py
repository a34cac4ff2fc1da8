"""Source attribution on hand-built decode timelines whose answers can be worked out by hand.

Decode node d0 has one rank with 10 pages of 4 tokens. A, B and C (8-token prompts, 4 generated
tokens: 3 pages each) run first; A and B finish, C is still running. Victim V (prompt 20,
2 generated: 6 pages) finds 1 free page, merges, and takes pages 1-6. It reads allocation
indices 1-4 (pages 2-5), last written by A (2, 3) and B (4, 5), and writes only page 1 and
page 6. V finishes; victim W takes pages 1-6 again and reads A's and B's stale pages a second
time, because V never overwrote them.
"""

from __future__ import annotations

import json

import pytest

from forensics.attribution import PagePool, stale_read
from forensics.case import load_case
from forensics.db import connect, insert_rows
from forensics.detect import detect_case

REJECT = (
    "Input length (20 tokens) exceeds the maximum allowed length (16 tokens)."
    " Use a shorter input or enable --allow-auto-truncate."
)


def _t(second: int) -> str:
    return f"2026-08-28T10:00:{second:02d}Z"


def _request(rid, tenant, prompt, start, end, **kw):
    return {
        "request_id": rid,
        "tenant_id": tenant,
        "received_at": _t(start),
        "prompt_tokens": prompt,
        "completion_tokens": kw.pop("completion", 4),
        "http_status": 200,
        "prefill_node": "p0",
        "decode_node": "d0",
        "dp_rank": 0,
        "ttft_ms": kw.pop("ttft", 50.0),
        "completed_at": _t(end),
        **kw,
    }


def _legs(rid, prompt, start, end, victim=False):
    prefill = {
        "request_id": rid,
        "role": "prefill",
        "node": "p0",
        "started_at": _t(start),
        "input_tokens": 1 if victim else prompt,
        "transferred_tokens": 1 if victim else prompt,
    }
    if victim:
        prefill["error"] = REJECT
    decode = {
        "request_id": rid,
        "role": "decode",
        "node": "d0",
        "dp_rank": 0,
        "started_at": _t(start),
        "finished_at": _t(end),
        "reserved_tokens": prompt,
        "transferred_tokens": 1 if victim else prompt,
    }
    return [prefill, decode]


TIMELINE = [  # request, tenant, prompt, start, end, victim
    ("A", "ta", 8, 1, 2, False),
    ("B", "tb", 8, 3, 4, False),
    ("C", "tc", 8, 5, 30, False),
    ("V", "tv", 20, 6, 7, True),
    ("W", "tw", 20, 8, 9, True),
]


def pool_snapshots(decode_at: int | None = 0) -> list[dict]:
    """The prefill node's limit (16 tokens) and, unless ``decode_at`` is None, the decode
    node's pool (10 pages of 4 tokens) from that second."""
    snaps = [
        {
            "node": "p0",
            "observed_at": _t(0),
            "role": "prefill",
            "max_total_num_tokens": 22,
            "max_req_input_len": 16,
            "context_length": 100,
        }
    ]
    if decode_at is not None:
        snaps.append(
            {
                "node": "d0",
                "observed_at": _t(decode_at),
                "role": "decode",
                "max_total_num_tokens": 40,
                "page_size": 4,
                "dp_size": 1,
            }
        )
    return snaps


def empty_case(tmp_path):
    """A case with no evidence yet: its manifest and its database."""
    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "INC-Q"\ncontext_length = 100\n')
    case = load_case(manifest)
    return case, connect(case.database)


def build_case(
    tmp_path,
    *,
    decode_snapshot=True,
    decode_snapshot_at=0,
    allocation_log=None,
    exclusion="",
    incident="",
):
    manifest = tmp_path / "case.toml"
    manifest.write_text(
        '[incident]\nid = "INC-T"\ncontext_length = 100\n'
        + incident
        + '[detection]\noverlap_window = "5s"\n'
        + exclusion
    )
    case = load_case(manifest)
    con = connect(case.database)
    insert_rows(
        con,
        "requests",
        [_request(r, t, p, s, e, completion=2 if v else 4) for r, t, p, s, e, v in TIMELINE],
    )
    insert_rows(
        con, "engine_legs", [leg for r, _t2, p, s, e, v in TIMELINE for leg in _legs(r, p, s, e, v)]
    )
    snaps = pool_snapshots(decode_at=decode_snapshot_at if decode_snapshot else None)
    insert_rows(con, "pool_snapshots", snaps)
    if allocation_log:
        insert_rows(con, "kv_allocations", allocation_log)
    return case, con


def exposures(con):
    return con.execute(
        """SELECT recipient_request_id, source_request_id, source_tenant_id, method, tokens,
                  confidence FROM findings_exposures ORDER BY 1, 2"""
    ).fetchall()


def test_page_pool_takes_lowest_free_pages_after_merge():
    pool = PagePool(pages=10)
    assert pool.alloc("A", 3).tolist() == [1, 2, 3]
    assert pool.alloc("B", 3).tolist() == [4, 5, 6]
    pool.free("A")
    assert pool.alloc("C", 3).tolist() == [7, 8, 9]  # free list still has 7..10: no merge
    pool.free("B")
    assert pool.alloc("D", 4).tolist() == [1, 2, 3, 4]  # 1 free page left: merge and sort
    assert pool.shortfalls == 0


def test_victim_reads_stale_pages_and_writes_only_first_and_generated():
    pool = PagePool(pages=10)
    pool.writer[pool.alloc(0, 3)] = 0
    pool.free(0)
    pages = pool.alloc(1, 8)  # 7 free: merge, so it gets pages 1-8, 0's pages first
    assert stale_read(pool, pages, 1, 20, 2, 4) == {0: 2}
    assert pool.writer[1:8].tolist() == [1, 0, 0, -1, -1, 1, -1]


def test_allocator_replay_names_every_writer_and_the_repeat_leak(tmp_path):
    case, con = build_case(tmp_path)
    summary = detect_case(con, case)
    assert summary.verdicts == {"confirmed": 2, "likely": 0, "possible": 0}
    assert exposures(con) == [
        ("V", "A", "ta", "allocator_replay", 8, "high"),
        ("V", "B", "tb", "allocator_replay", 8, "high"),
        ("W", "A", "ta", "allocator_replay", 8, "high"),
        ("W", "B", "tb", "allocator_replay", 8, "high"),
    ]


@pytest.mark.parametrize("first_token", [12, 5], ids=["waited", "answered-before-room"])
def test_a_client_timed_request_waits_for_room_but_not_past_its_first_token(tmp_path, first_token):
    # Client records alone. A decode pool of 10 pages of 4 tokens; A (12 + 20 tokens, 8 pages)
    # holds it from 1 to 10. V (prompt 20 over the prefill limit of 16, 6 pages) arrives at 2:
    # the engine held it until A's release made room, then V took pages 1-6 and read A's KV in
    # pages 2-5. Had its first token come at 5, before any room, the replay would disagree with
    # the logs: its source stays a candidate at a lower confidence, and the rank is warned of.
    case, con = empty_case(tmp_path)
    insert_rows(
        con,
        "requests",
        [
            _request("A", "ta", 12, 1, 10, completion=20, ttft=None, first_token_at=_t(1)),
            _request("V", "tv", 20, 2, 14, completion=2, ttft=None, first_token_at=_t(first_token)),
        ],
    )
    insert_rows(con, "pool_snapshots", pool_snapshots(decode_at=0))
    summary = detect_case(con, case)
    found = exposures(con)
    if first_token == 12:
        assert found == [("V", "A", "ta", "allocator_replay", 16, "medium")]
        assert not any("did not fit" in w for w in summary.warnings)
    else:
        assert ("V", "A", "ta", "allocator_replay", 16, "low") in found
        assert any("did not fit the replayed pool" in w for w in summary.warnings)


@pytest.mark.parametrize("decode_snapshot", [True, False], ids=["replay", "temporal"])
def test_attribution_leaves_no_working_table_behind(tmp_path, decode_snapshot):
    # The decode timeline is as long as the traffic: left in place, it holds spill space the
    # steps after attribution need.
    from forensics.attribution import WORKING_TABLES

    case, con = build_case(tmp_path, decode_snapshot=decode_snapshot)
    detect_case(con, case)
    assert con.execute("SELECT count(*) FROM findings_exposures").fetchone()[0] > 0
    left = con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()
    assert not {t for (t,) in left} & set(WORKING_TABLES)


def test_allocation_log_is_used_when_present(tmp_path):
    def run(rid, at, op, first, count):
        return {
            "node": "d0",
            "dp_rank": 0,
            "request_id": rid,
            "at": _t(at),
            "op": op,
            "first_page": first,
            "page_count": count,
        }

    log = [
        run("A", 1, "alloc", 1, 3),
        run("A", 2, "free", 1, 3),
        run("B", 3, "alloc", 4, 3),
        run("B", 4, "free", 4, 3),
        run("C", 5, "alloc", 7, 3),
        # V's log shows pages 1-2 and 7-10: C's pages, which the replay would not pick.
        run("V", 6, "alloc", 1, 2),
        run("V", 6, "alloc", 7, 4),
    ]
    case, con = build_case(tmp_path, allocation_log=log)
    detect_case(con, case)
    got = [e for e in exposures(con) if e[0] == "V"]
    assert got == [
        ("V", "A", "ta", "allocation_log", 4, "exact"),
        ("V", "C", "tc", "allocation_log", 12, "exact"),
    ]


def test_temporal_fallback_ranks_recent_releases_and_warns(tmp_path):
    case, con = build_case(tmp_path, decode_snapshot=False)
    summary = detect_case(con, case)
    assert any("no pool snapshot" in w for w in summary.warnings)
    rows = con.execute(
        """SELECT recipient_request_id, source_request_id, rank, confidence
           FROM findings_exposures ORDER BY 1, 3"""
    ).fetchall()
    # Window 5 s: V (t=6) sees B (released t=4) then A (t=2); W (t=8) sees V and B in the
    # window, and A (t=2) only as an older release of another tenant; C never ended.
    assert rows == [
        ("V", "B", 1, "low"),
        ("V", "A", 2, "low"),
        ("W", "V", 1, "low"),
        ("W", "B", 2, "low"),
        ("W", "A", 3, "very_low"),
    ]


def test_a_victim_before_the_first_pool_snapshot_is_told_why_it_has_candidates_only(tmp_path):
    # d0's only snapshot is at t=7 (an earlier one lost): V took its pages at t=6, before any
    # pool is known; W at t=8, after it, is replayed from an empty history.
    case, con = build_case(tmp_path, decode_snapshot_at=7)
    summary = detect_case(con, case)
    status = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT recipient_request_id, method, status, note FROM findings_attribution"
        ).fetchall()
    }
    why = (
        "no pool snapshot of d0 before 2026-08-28T10:00:07Z (its first), so its pool cannot be"
        " replayed before then; the sources are temporal candidates only"
    )
    assert status["V"] == ("temporal", "candidates", why)
    # W's pages were last written before the replayed history begins: not known, not guessed.
    assert status["W"][:2] == ("allocator_replay", "partial")
    warning = f"d0: 1 affected response took pages there before its pool was known: {why}"
    assert warning in summary.warnings
    # Its candidates are the releases before it in the overlap window, as on a node with no
    # snapshot at all (test_temporal_fallback_ranks_recent_releases_and_warns).
    assert [e[1:] for e in exposures(con) if e[0] == "V"] == [
        ("A", "ta", "temporal", 12, "low"),
        ("B", "tb", "temporal", 12, "low"),
    ]


def test_excluded_recipient_keeps_its_sources_marked(tmp_path):
    rule = '[[exclusion]]\nname = "researcher"\nreason = "bounty"\ntenant_ids = ["tv"]\n'
    case, con = build_case(tmp_path, exclusion=rule)
    detect_case(con, case)
    assert con.execute(
        "SELECT request_id, excluded_by FROM findings_affected ORDER BY 1"
    ).fetchall() == [("V", "researcher"), ("W", None)]
    assert con.execute(
        "SELECT name, requests_matched, affected_matched, tenants_matched FROM findings_exclusions"
    ).fetchall() == [("researcher", 1, 1, 1)]
    marks = con.execute(
        """SELECT DISTINCT recipient_request_id, recipient_excluded_by, source_excluded_by
           FROM findings_exposures ORDER BY 1"""
    ).fetchall()
    assert marks == [("V", "researcher", None), ("W", None, None)]


@pytest.mark.parametrize(
    "rule,warned",
    [
        ('tenant_ids = ["tv"]', None),  # names the tenant it takes: nothing to say
        (
            'tenant_ids = ["t-canary"]\nuser_agent_regex = "^sdk/"',
            "exclusion internal takes 1 affected response and 1 request whose KV another tenant"
            " read from 2 tenants its tenant_ids do not name (ta, tv): they leave the customer"
            " counts and are not notified. Check that its other selectors match only the"
            " researcher's and our own traffic.",
        ),
    ],
)
def test_an_exclusion_that_takes_tenants_it_does_not_name_is_a_warning(tmp_path, rule, warned):
    # A (ta) is read by V and W; V (tv) is a victim. Both send with the user agent the rule's
    # regex was written for the canary's.
    case, con = build_case(
        tmp_path, exclusion=f'[[exclusion]]\nname = "internal"\nreason = "canary"\n{rule}\n'
    )
    con.execute("UPDATE requests SET user_agent = 'sdk/2' WHERE request_id IN ('A', 'V')")
    summary = detect_case(con, case)
    beyond = [w for w in summary.warnings if w.startswith("exclusion internal")]
    assert beyond == ([warned] if warned else [])


@pytest.mark.parametrize("drop", ["engine_legs", "pool_snapshots", "placement"])
def test_missing_evidence_degrades_with_a_warning(tmp_path, drop):
    case, con = build_case(tmp_path)
    if drop == "placement":
        con.execute("UPDATE requests SET prefill_node = NULL, decode_node = NULL, dp_rank = NULL")
        con.execute("DELETE FROM engine_legs WHERE role = 'decode'")
    else:
        con.execute(f"DELETE FROM {drop}")
    summary = detect_case(con, case)
    assert summary.warnings
    verdicts = dict(con.execute("SELECT request_id, verdict FROM findings_affected").fetchall())
    if drop == "pool_snapshots":
        # The prefill rejections still name the limit; both victims stay confirmed.
        assert verdicts == {"V": "confirmed", "W": "confirmed"}
    elif drop == "engine_legs":
        # over_pool alone; far too few long prompts here to fit a latency curve.
        assert verdicts == {"V": "likely", "W": "likely"}
    else:
        assert set(verdicts) == {"V", "W"}
    case_rows = dict(con.execute("SELECT key, value FROM findings_case").fetchall())
    assert json.loads(case_rows["exploitation"])["conclusion"]


def test_exposures_of_a_log_and_of_a_replay_go_in_together():
    # One case can have ranks with an allocation log (Python rows) and replayed ranks (Arrow
    # columns as DuckDB hands them back): both become one table of one schema.
    from datetime import UTC, datetime

    import pyarrow as pa

    from forensics.attribution import Exposure, _exposure_schema, _exposure_table, _insert_exposures
    from forensics.schema import FINDINGS_DDL

    at = datetime(2026, 9, 1, tzinfo=UTC)
    logged = _exposure_table(
        [Exposure("V", "tv", "A", "ta", "allocation_log", 4, "exact", None, at)]
    )
    con = connect(":memory:")
    replayed = con.sql(
        """SELECT 'W' AS recipient_request_id, 'tw' AS recipient_tenant_id,
                  'B' AS source_request_id, NULL::VARCHAR AS source_tenant_id,
                  'allocator_replay' AS method, 8::BIGINT AS tokens, 'high' AS confidence,
                  NULL::INTEGER AS rank,
                  TIMESTAMPTZ '2026-09-01 00:00:01+00' AS source_released_at"""
    ).to_arrow_table()
    con.execute(FINDINGS_DDL["findings_exposures"])
    both = pa.concat_tables([t.cast(_exposure_schema()) for t in (logged, replayed)])
    _insert_exposures(con, both)
    assert con.execute(
        "SELECT recipient_request_id, source_tenant_id, tokens, epoch(source_released_at)"
        " FROM findings_exposures ORDER BY 1"
    ).fetchall() == [("V", "ta", 4, at.timestamp()), ("W", None, 8, at.timestamp() + 1)]


_TIMELINE_ROWS = """SELECT node, dp_rank,
                          CASE WHEN i < n THEN TIMESTAMPTZ '2026-09-01 00:00:00+00'
                                               + to_seconds(-i) END AS alloc_at,
                          NULL::TIMESTAMPTZ AS free_at, node || i AS request_id, 't' AS tenant_id,
                          10 AS prompt_tokens, 0 AS completion_tokens,
                          'engine_legs' AS source_table, true AS size_known
                   FROM (VALUES ('c', 0, 9), ('a', 1, 2), ('b', NULL, 4), ('a', 0, 3),
                                ('e', 0, 1)) v(node, dp_rank, n), range(n + 1) r(i)"""


def test_ranks_replay_in_chunks_of_bounded_rows():
    from forensics.attribution import _rank_chunks, _RankSpan, _replayed_spans

    con = connect(":memory:")
    # In the order timeline.sql writes it; each rank has one row that took no pages (last).
    con.execute(
        f"""CREATE TEMP TABLE decode_timeline AS {_TIMELINE_ROWS}
            ORDER BY node NULLS LAST, dp_rank NULLS FIRST, alloc_at NULLS LAST, request_id"""
    )
    ranks = [("a", 0), ("a", 1), ("b", None), ("d", 0), ("c", 0)]
    spans = _replayed_spans(con, ranks)
    # Ranks in table order, each rank's rows that took pages together; a rank with no rows
    # (d) or not asked for (e) has no span.
    assert spans == [
        _RankSpan(("a", 0), 0, 3),
        _RankSpan(("a", 1), 4, 2),
        _RankSpan(("b", None), 7, 4),
        _RankSpan(("c", 0), 12, 9),
    ]
    # Within a rank, allocation order (the rows were made latest first).
    assert con.execute(
        "SELECT request_id FROM decode_timeline WHERE rowid BETWEEN 0 AND 2 ORDER BY rowid"
    ).fetchall() == [("a2",), ("a1",), ("a0",)]
    # Runs of at most 5 rows; a rank larger than that goes alone.
    assert [[s.key for s in run] for run in _rank_chunks(spans, rows=5)] == [
        [("a", 0), ("a", 1)],
        [("b", None)],
        [("c", 0)],
    ]
    assert _rank_chunks(spans, rows=100) == [spans]
    assert _rank_chunks([], rows=5) == []
    assert _replayed_spans(con, []) == []


def test_a_timeline_out_of_replay_order_is_an_error_not_a_replay():
    from forensics.attribution import _replayed_spans

    con = connect(":memory:")
    con.execute(f"CREATE TEMP TABLE decode_timeline AS {_TIMELINE_ROWS} ORDER BY request_id")
    with pytest.raises(RuntimeError, match="not in replay order"):
        _replayed_spans(con, [("a", 0), ("c", 0)])


def test_replay_in_chunks_finds_what_one_pass_finds(tiny_case_dir, monkeypatch):
    import forensics.attribution as attribution
    from forensics.ingest import ingest_case

    case = load_case(tiny_case_dir / "case.toml")
    ingest_case(case)
    con = connect(case.database)
    query = """SELECT * FROM findings_exposures ORDER BY ALL"""
    detect_case(con, case)
    whole = con.execute(query).fetchall()
    replayed = con.execute(
        "SELECT count(DISTINCT (node, dp_rank)) FROM findings_attribution "
        "WHERE method = 'allocator_replay'"
    ).fetchone()[0]
    monkeypatch.setattr(attribution, "REPLAY_CHUNK_ROWS", 1)  # every rank its own chunk
    detect_case(con, case)
    assert replayed > 1 and len(whole) > 0
    assert con.execute(query).fetchall() == whole


@pytest.mark.parametrize(
    "start,warned",
    [
        (_t(0), None),  # every request inside: nothing to say
        (
            _t(7),  # V (t=6), a victim, arrived before it
            "Requests loaded outside the analysis window were not judged: 4 before the analysis"
            " window (from 2026-08-28T10:00:01Z). 1 of them shows the defect's signature (a"
            " prefill rejection, or a prompt over every prefill node's limit, answered): widen"
            " [incident] start or end if the exposure may reach beyond the window.",
        ),
    ],
)
def test_a_window_that_leaves_out_the_defects_signature_is_a_warning(tmp_path, start, warned):
    case, con = build_case(tmp_path, incident=f'start = "{start}"\n')
    summary = detect_case(con, case)
    outside = [w for w in summary.warnings if w.startswith("Requests loaded outside")]
    assert outside == ([warned] if warned else [])
    # Detection itself judged only the window.
    affected = {r[0] for r in con.execute("SELECT request_id FROM findings_affected").fetchall()}
    assert affected == ({"V", "W"} if warned is None else {"W"})


@pytest.mark.parametrize(
    "apart_us,w_entered_us",
    [(0, 1_000_000), (100, 1_000_000), (0, 60)],
    ids=["one-admission", "apart", "order-unsettled"],
)
def test_legs_admitted_together_take_the_queues_order_not_their_rounded_times(
    tmp_path, apart_us, w_entered_us
):
    # A decode pool of 20 pages of 4 tokens. A holds pages 1-16 from 1 s to 10 s; X held 17-20
    # until 3 s. V (a victim: prompt 20 over the prefill limit of 16, 6 pages) entered the
    # preallocation queue at 5 s, W (14 pages) at 6 s; both waited for A's release and were
    # admitted together, V first: V took pages 1-6 (A's KV) and W 7-20. Their allocation times
    # are rebuilt from rounded durations (SGLang's time stats), which put W 8 us before V; each
    # leg's wait in the queue (`prealloc_wait_s`, from the same line) says V entered first.
    # Logged 100 us apart, two allocations are not one admission, and the log's order stands:
    # W took 1-14 first, V 15-20 (page 16 of A, 17-19 of X).
    # W entering 60 us after V is within the rounding of two entries: either may have entered
    # first, so both orders are replayed. A's KV is read either way (its larger amount, at the
    # replay's confidence); X's only if W went first: named, one step lower.
    case, con = empty_case(tmp_path)

    def at(second: int, us: int = 0) -> str:
        return f"2026-08-28T10:00:{second:02d}.{us:06d}Z"

    clients = [  # request, tenant, prompt, completion, received, completed
        ("A", "ta", 4, 60, 1, 10),
        ("X", "tx", 4, 12, 2, 3),
        ("V", "tv", 20, 2, 5, 20),
        ("W", "tw", 4, 52, 6, 20),
    ]
    insert_rows(
        con,
        "requests",
        [
            _request(r, t, p, s, e, completion=c, ttft=None, first_token_at=_t(e - 1))
            for r, t, p, c, s, e in clients
        ],
    )
    v_at, w_at = 12 + apart_us, 4
    legs = []
    for r, _tenant, p, _c, s, e in clients:
        victim = r == "V"
        legs += _legs(r, p, s, e, victim=victim)
        decode = legs[-1]
        if r in ("V", "W"):
            us = v_at if victim else w_at
            decode["started_at"] = at(10, us)
            entered = 5 + w_entered_us / 1e6 if r == "W" else s
            decode["prealloc_wait_s"] = round(10 + us / 1e6 - entered, 6)
        else:
            decode["started_at"] = at(s)
            decode["finished_at"] = at(e)
    insert_rows(con, "engine_legs", legs)
    insert_rows(
        con,
        "pool_snapshots",
        [
            pool_snapshots(decode_at=None)[0],
            {
                "node": "d0",
                "observed_at": _t(0),
                "role": "decode",
                "max_total_num_tokens": 80,
                "page_size": 4,
                "dp_size": 1,
            },
        ],
    )
    summary = detect_case(con, case)
    reads = [(r, s, tokens, c) for r, s, _t3, _m, tokens, c in exposures(con) if r == "V"]
    status = con.execute(
        "SELECT status, note FROM findings_attribution WHERE recipient_request_id = 'V'"
    ).fetchone()
    unsettled = [w for w in summary.warnings if "do not settle their order" in w]
    if w_entered_us < 100:
        assert reads == [("V", "A", 16, "high"), ("V", "X", 12, "medium")]
        assert (
            status[0] == "approximate" and "the queue order of legs admitted together" in status[1]
        )
        assert len(unsettled) == 1 and "d0 rank 0: 1 group of decode legs" in unsettled[0]
        return
    assert status == ("complete", None) and unsettled == []
    if apart_us == 0:
        assert reads == [("V", "A", 16, "high")]
    else:
        assert reads == [("V", "A", 4, "high"), ("V", "X", 12, "high")]
