"""SGLang engine logs onto engine_legs and pool_snapshots: exact rows, exact rejects."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime

import pytest
from fixtures.adapted import FORMATS, rejects, rows, ts

from forensics.errors import EvidenceError
from forensics.ingest import ingest_file

REJECTION = (
    "Input length (712345 tokens) exceeds the maximum allowed length (681274 tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)
ROOM = "9223372036854775807"
LEG_COLUMNS = (
    "request_id, role, node, started_at, finished_at, input_tokens, reserved_tokens, "
    "transferred_tokens, bootstrap_room, dp_rank, finish_type, status_code, error"
)


def legs(con, evidence_id: int) -> list[tuple]:
    return rows(con, "engine_legs", LEG_COLUMNS, evidence_id)


def extra(con, evidence_id: int, request_id: str) -> dict:
    text = con.execute(
        "SELECT extra FROM engine_legs WHERE evidence_id = ? AND request_id = ?",
        [evidence_id, request_id],
    ).fetchone()[0]
    return json.loads(text)


def test_text_log_lines_of_one_request_merge_into_its_leg(memory_db):
    result = ingest_file(memory_db, FORMATS / "prefill-0.log", "engine_legs", "sglang")
    assert (result.format, result.rows_read, result.rows_loaded, result.rows_rejected) == (
        "sglang",
        10,
        2,
        8,
    )
    assert legs(memory_db, result.evidence_id) == [
        # Receive, rejection, Finish and Req Time Stats lines of r1: one prefill leg, timed by
        # the request's own received_time + e2e_latency, the node from the file name.
        (
            "r1",
            "prefill",
            "prefill-0",
            ts("2026-09-08 14:02:00.250"),
            ts("2026-09-08 14:02:02"),
            1,
            None,
            None,
            ROOM,
            None,
            "length",
            200,
            REJECTION,
        ),
        # Only a ReqTimeStats line (newer spelling): the line's own time, no zone = the case's.
        (
            "r2",
            "prefill",
            "prefill-0",
            ts("2026-09-08 14:03:00"),
            ts("2026-09-08 14:03:00"),
            1200,
            None,
            None,
            "42",
            None,
            None,
            None,
            None,
        ),
    ]
    r1 = extra(memory_db, result.evidence_id, "r1")
    # The custom label is the tenant; the rid inside the request text did not shadow the rid.
    assert r1["tenant_id"] == "acct_7"
    assert (r1["completion_tokens"], r1["e2e_latency"], r1["lines"]) == (1, 1.75, 4)
    assert r1["time_stats"].startswith("bootstrap_queue_duration(0.50ms)")
    assert extra(memory_db, result.evidence_id, "r2")["cached_tokens"] == 100
    other = "a log line about no single request (batch statistics and the like)"
    cont = (
        "no [timestamp] prefix: a continuation of the record above (e.g. a traceback) or "
        "other output"
    )
    assert rejects(memory_db, result.evidence_id) == [
        (1, None, other),
        (2, None, other),
        (3, None, "the startup line (KV pool size): load this file as pool_snapshots to read it"),
        (5, None, other),
        (9, None, cont),
        (10, None, cont),
        (12, None, "a request line without a rid"),
        (13, None, "not valid JSON"),
    ]


def test_json_request_log_with_scheduler_lines_and_both_tenant_sources(memory_db):
    result = ingest_file(
        memory_db,
        FORMATS / "decode-0_0.log",
        "engine_legs",
        "sglang",
        defaults={"role": "decode"},
    )
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (4, 2, 2)
    assert legs(memory_db, result.evidence_id) == [
        (
            "r1",
            "decode",
            "decode-0",
            ts("2026-09-08 14:02:00.400"),
            ts("2026-09-08 14:02:02.900"),
            712345,
            712345,
            None,
            ROOM,
            1,
            "stop",
            200,
            None,
        ),
        # Numbers as strings; no received_time, so the event's naive timestamp; the capacity
        # line of the scheduler (text, in the same stdout) merged in: nothing was reserved.
        (
            "r3",
            "decode",
            "decode-0",
            ts("2026-09-08 14:05:00"),
            ts("2026-09-08 14:05:00.500"),
            900000,
            0,
            None,
            None,
            None,
            "abort",
            400,
            "Request r3 exceeds the maximum number of tokens: 900000 > 800000",
        ),
    ]
    assert extra(memory_db, result.evidence_id, "r1")["tenant_id"] == "acct_7"
    # A whitelisted header stands in when there is no custom label.
    assert extra(memory_db, result.evidence_id, "r3")["tenant_id"] == "acct_9"
    assert extra(memory_db, result.evidence_id, "r1")["logged"] == {
        "obj": {"custom_labels": {"tenant_id": "acct_7"}, "stream": False},
        "meta_info": {"weight_version": "default"},
    }
    assert rejects(memory_db, result.evidence_id) == [
        (
            6,
            None,
            "a JSON line that is no request event (no request.received or request.finished "
            "event, no request_parameters)",
        ),
        (8, "input_tokens", "out of range: '-3' (token counts are 0 to 100,000,000)"),
    ]


def test_tenant_field_names_another_label_or_header(memory_db):
    result = ingest_file(
        memory_db,
        FORMATS / "prefill-0.log",
        "engine_legs",
        "sglang",
        tenant_field="tier",
    )
    assert extra(memory_db, result.evidence_id, "r1")["tenant_id"] == "pro"
    assert "tenant_id" not in extra(memory_db, result.evidence_id, "r2")


def test_metrics_exporter_file_needs_its_node_from_the_entry(memory_db):
    path = FORMATS / "sglang-request-metrics-20260908_14.log"
    with pytest.raises(EvidenceError, match="does not name its engine: give node"):
        ingest_file(memory_db, path, "engine_legs", "sglang", defaults={"role": "decode"})
    result = ingest_file(
        memory_db, path, "engine_legs", "sglang", defaults={"role": "decode", "node": "d-9"}
    )
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (3, 2, 1)
    assert legs(memory_db, result.evidence_id) == [
        (
            "r5",
            "decode",
            "d-9",
            ts("2026-09-08 14:08:20.125"),
            ts("2026-09-08 14:08:24.375"),
            3000,
            3000,
            None,
            "77",
            0,
            "length",
            200,
            None,
        ),
        # The exporter's own request_finished_ts wins over received_time + e2e_latency.
        (
            "r6",
            "decode",
            "d-9",
            ts("2026-09-08 14:10:00"),
            ts("2026-09-08 14:10:00.750"),
            10,
            10,
            None,
            None,
            None,
            "stop",
            200,
            None,
        ),
    ]
    assert extra(memory_db, result.evidence_id, "r5")["tenant_id"] == "acct_3"
    assert rejects(memory_db, result.evidence_id) == [(3, None, "a request line without a rid")]


def test_a_leg_without_a_role_is_rejected_saying_so(memory_db):
    result = ingest_file(memory_db, FORMATS / "decode-0_0.log", "engine_legs", "sglang")
    assert result.rows_loaded == 0
    reasons = {r[1:] for r in rejects(memory_db, result.evidence_id)}
    assert ("role", "required value missing") in reasons


def test_server_info_documents_pretty_or_compact_become_snapshots(memory_db):
    at = datetime(2026, 9, 8, 14, tzinfo=UTC)
    pretty = ingest_file(
        memory_db,
        FORMATS / "server_info-decode-0.json",
        "pool_snapshots",
        "sglang",
        defaults={"node": "decode-0", "observed_at": at},
    )
    compact = ingest_file(
        memory_db,
        FORMATS / "server_info-unified.json",
        "pool_snapshots",
        "auto",
        defaults={"node": "unified-0", "observed_at": at},
    )
    assert compact.format == "sglang"
    rows = memory_db.execute(
        "SELECT node, observed_at, max_total_num_tokens, role, max_req_input_len, "
        "context_length, page_size, dp_size, engine_version, extra->>'$.tp_size', "
        "extra->>'$.disaggregation_transfer_backend' FROM pool_snapshots ORDER BY evidence_id"
    ).fetchall()
    assert rows == [
        ("decode-0", at, 2097152, "decode", 1048570, 1048576, 64, 2, "0.5.14", "8", "mooncake"),
        # An older build: the pool is under internal_states, "null" mode is a unified engine.
        ("unified-0", at, 681280, "unified", 681274, 1048576, None, None, "0.5.9", None, None),
    ]
    assert (pretty.rows_read, compact.rows_read) == (1, 1)


def test_server_info_without_observed_at_is_refused(memory_db):
    with pytest.raises(EvidenceError, match="does not say when it was taken: give observed_at"):
        ingest_file(
            memory_db,
            FORMATS / "server_info-unified.json",
            "pool_snapshots",
            "sglang",
            defaults={"node": "u"},
        )


def test_startup_line_of_a_rotated_compressed_log_is_a_snapshot(tmp_path, memory_db):
    text = (FORMATS / "prefill-0.log").read_bytes()
    path = tmp_path / "prefill-1_0.log.2026-09-08_14.gz"
    path.write_bytes(gzip.compress(text))
    result = ingest_file(
        memory_db,
        path,
        "pool_snapshots",
        "sglang",
        timezone="Europe/Rome",
        defaults={"role": "prefill"},
    )
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (13, 1, 12)
    assert memory_db.execute(
        "SELECT node, observed_at, max_total_num_tokens, role, context_length, "
        "extra->>'$.max_running_requests' FROM pool_snapshots"
    ).fetchall() == [("prefill-1", ts("2026-09-08 12:00:05"), 681280, "prefill", 1048576, "64")]
    reasons = {r[2] for r in rejects(memory_db, result.evidence_id)}
    assert reasons == {
        "a log line that is not the startup line (no max_total_num_tokens=)",
        "no [timestamp] prefix: a continuation of the record above (e.g. a traceback) or "
        "other output",
        "not valid JSON",
    }


def test_a_damaged_compressed_log_loads_the_lines_before_the_damage(tmp_path, memory_db):
    data = gzip.compress((FORMATS / "prefill-0.log").read_bytes())
    path = tmp_path / "prefill-0.log.gz"
    path.write_bytes(data[: len(data) // 2])
    result = ingest_file(memory_db, path, "engine_legs", "sglang", defaults={"role": "prefill"})
    assert result.outcome == "partial"
    assert result.rows_read == result.rows_loaded + result.rows_rejected


def _leg_spans(con, name: str, role: str):
    """Ingest one fixture log as a node of ``role``: its result, and each leg's request id,
    role, start and end in request order."""
    result = ingest_file(con, FORMATS / name, "engine_legs", "sglang", defaults={"role": role})
    spans = con.execute(
        "SELECT request_id, role, started_at, finished_at FROM engine_legs "
        "WHERE evidence_id = ? ORDER BY request_id",
        [result.evidence_id],
    ).fetchall()
    return result, spans


def test_unified_leg_starts_when_a_batch_took_it_in(memory_db):
    # Without disaggregation a request waits in the scheduler's queue and gets its KV pages
    # when a batch takes it in; the forward runs from there to the end.
    result, started = _leg_spans(memory_db, "unified-0.log", "unified")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (4, 4, 0)
    assert started == [
        # The end (received 10:00:00 + e2e 5 s) less the forward (2.9 s); not the queue's
        # entry plus the queueing (10:00:02.05), nor the received time plus it (10:00:02).
        ("u1", "unified", ts("2026-09-08 10:00:02.100"), ts("2026-09-08 10:00:05")),
        # No e2e latency: the queue's wall-clock entry plus the queueing (1.5 s).
        ("u2", "unified", ts("2026-09-08 10:01:01.750"), ts("2026-09-08 10:01:04")),
        # An older release (monotonic start_time) and no e2e: received plus the queueing.
        ("u3", "unified", ts("2026-09-08 10:02:03"), ts("2026-09-08 10:02:04")),
        # No time-stats line: the received time.
        ("u4", "unified", ts("2026-09-08 10:03:00"), ts("2026-09-08 10:03:02")),
    ]


def test_an_empty_log_loads_nothing_and_says_so(tmp_path, memory_db):
    for i, kind in enumerate(("engine_legs", "pool_snapshots")):
        path = tmp_path / f"decode-{i}.log"
        path.write_text("\r\n" * (i + 1))  # blank lines only (two files: two digests)
        result = ingest_file(memory_db, path, kind, "sglang", defaults={"role": "decode"})
        assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (0, 0, 0)


def test_decode_leg_starts_when_its_pages_were_allocated(memory_db):
    # A decode request waits in the preallocation queue (bootstrap, then free pages) before it
    # holds KV: the replay needs that instant, not when the request arrived.
    result, started = _leg_spans(memory_db, "decode-1_0.log", "decode")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (5, 5, 0)
    assert started == [
        # The end (received 14:02:00.4 + e2e 3 s) less transfer, queue and forward (900 ms);
        # not the received time plus the queueing (14:02:01.9), nor the monotonic start=.
        ("q1", "decode", ts("2026-09-08 14:02:02.500"), ts("2026-09-08 14:02:03.400")),
        # No e2e latency: the queue's wall-clock entry plus bootstrap and wait (2,000.5 ms).
        ("q2", "decode", ts("2026-09-08 14:03:02.250500"), ts("2026-09-08 14:03:04")),
        # Neither: the received time plus the queueing (3 s).
        ("q3", "decode", ts("2026-09-08 14:04:03"), ts("2026-09-08 14:04:05")),
        # Durations longer than the leg (0.9 s of 0.5 s): never before it was received.
        ("q4", "decode", ts("2026-09-08 14:05:00"), ts("2026-09-08 14:05:00.500")),
        # No time-stats line: the received time.
        ("q5", "decode", ts("2026-09-08 14:06:00"), ts("2026-09-08 14:06:02")),
    ]
    # The engine's own count of generated tokens, which sizes the allocation in the replay
    # when no client record does.
    assert extra(memory_db, result.evidence_id, "q1")["completion_tokens"] == 8
    # How long each waited in the preallocation queue, in either form of the line: the order in
    # which legs admitted together entered it (the timeline's first in, first out).
    waits = [extra(memory_db, result.evidence_id, q).get("prealloc_wait_s") for q in ("q1", "q2")]
    assert waits == [1.5, 2.0005]
    assert "prealloc_wait_s" not in extra(memory_db, result.evidence_id, "q5")


def test_a_schedulers_prefix_gives_the_rank_a_build_logs_nowhere_else(tmp_path, memory_db):
    # A build that logs no data_parallel_rank in the request and no dp_rank in meta_info: the
    # scheduler's lines still carry " DP<rank>" in their logging prefix when DP is on.
    def request(rid: str, prefix: str, own: str = "") -> list[str]:
        obj = f"GenerateReqInput(rid='{rid}', received_time=1788876120.4, bootstrap_room=7{own})"
        meta = (
            f"{{'id': '{rid}', 'finish_reason': {{'type': 'stop'}}, 'prompt_tokens': 2000,"
            " 'completion_tokens': 8, 'cached_tokens': 0, 'e2e_latency': 2.5}"
        )
        return [
            f"[2026-09-08 14:02:00] Receive: obj={obj}",
            f"[2026-09-08 14:02:02{prefix}] ReqTimeStats(rid={rid}, bootstrap_room=7,"
            " input_len=2000, cached_input_len=0, output_len=8, type=decode):"
            " prealloc_queue_duration(0.50ms) = bootstrap(0.50ms) + alloc_wait(0.00ms);"
            " transfer_duration=10.00ms; queue_duration=0.00ms, forward_duration=90.00ms,"
            " start=98765.432",
            f"[2026-09-08 14:02:02] Finish: obj={obj}, out={{'text': '', 'meta_info': {meta}}}",
        ]

    log = tmp_path / "decode-3.log"
    lines = [
        *request("p1", " DP1 TP0"),  # the prefix alone says the rank
        *request("p2", " TP0"),  # DP off, or not logged: no rank
        *request("p3", " DP1 TP0", own=", data_parallel_rank=0"),  # the request's own wins
        "[2026-09-08 14:03:00 DP12 TP3 EP3] Decode batch, #running-req: 3, #token: 9000",
    ]
    log.write_text("\n".join(lines) + "\n")
    result = ingest_file(memory_db, log, "engine_legs", "sglang", defaults={"role": "decode"})
    assert (result.rows_loaded, result.rows_rejected) == (3, 1)
    ranks = memory_db.execute(
        "SELECT request_id, dp_rank FROM engine_legs WHERE evidence_id = ? ORDER BY request_id",
        [result.evidence_id],
    ).fetchall()
    assert ranks == [("p1", 1), ("p2", None), ("p3", 0)]
