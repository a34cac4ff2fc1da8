"""OTLP/JSON GenAI spans and LiteLLM spend logs onto requests: exact rows, exact rejects."""

from __future__ import annotations

import json

import pytest
from fixtures.adapted import FORMATS, rejects, rows, ts

from forensics.errors import EvidenceError
from forensics.ingest import ingest_file

COLUMNS = (
    "request_id, tenant_id, received_at, prompt_tokens, http_status, completion_tokens, "
    "cached_tokens, first_token_at, completed_at, ttft_ms, e2e_ms, finish_reason, model, "
    "prefill_node, decode_node, dp_rank, bootstrap_room, api_key_id, client_ip, user_agent"
)


def requests(con, evidence_id: int) -> list[tuple]:
    return rows(con, "requests", COLUMNS, evidence_id)


SPAN_R1 = (
    "r1",
    "acct_1",
    ts("2026-09-08 14:02:00.250"),
    712345,
    200,
    12,
    0,
    ts("2026-09-08 14:02:00.650"),
    ts("2026-09-08 14:02:02.750"),
    400.0,
    None,
    "stop",
    "glm-5.3",
    None,
    "decode-0",
    1,
    "9223372036854775807",
    None,
    "203.0.113.9",
    "sdk/1.2",
)


def test_otlp_file_exporter_lines_current_and_older_attribute_names(memory_db):
    result = ingest_file(memory_db, FORMATS / "traces.jsonl", "requests", "otel")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (6, 2, 4)
    assert requests(memory_db, result.evidence_id) == [
        SPAN_R1,
        # instrumentationLibrarySpans, gen_ai.usage.prompt_tokens, integer epochs, the tenant
        # as a span attribute over the resource's; error.type carries the HTTP status.
        (
            "b7ad6b7169203331",
            "acct_2",
            ts("2026-09-08 14:05:00"),
            900000,
            429,
            0,
            None,
            None,
            ts("2026-09-08 14:05:00.500"),
            None,
            None,
            None,
            "glm-5.3",
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ),
    ]
    extra = json.loads(
        memory_db.execute(
            "SELECT extra FROM requests WHERE request_id = 'r1' AND evidence_id = ?",
            [result.evidence_id],
        ).fetchone()[0]
    )
    assert extra == {
        "trace_id": "5b8efff798038103d269b633813fc60c",
        "span_id": "eee19b7ec3c1b174",
        "name": "chat glm-5.3",
        "attributes": {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "server.port": "8000",
        },
        "resource": {"service.name": "gateway"},
    }
    assert rejects(memory_db, result.evidence_id) == [
        (2, None, "a span with no gen_ai.* attribute: not an inference call"),
        (
            4,
            None,
            "a failed call (error.type timeout) without an HTTP status: what the client got "
            "is not in the span",
        ),
        (5, None, "no resourceSpans: not an OTLP/JSON trace export"),
        (6, None, "not valid JSON"),
    ]


def test_a_pretty_printed_export_is_one_document_and_auto_finds_it(memory_db):
    result = ingest_file(memory_db, FORMATS / "trace-pretty.json", "requests", "auto")
    assert (result.format, result.rows_read, result.rows_loaded) == ("otel", 2, 1)
    assert requests(memory_db, result.evidence_id) == [SPAN_R1]


def test_otel_tenant_field_names_a_resource_attribute(memory_db):
    result = ingest_file(
        memory_db, FORMATS / "traces.jsonl", "requests", "otel", tenant_field="service.name"
    )
    # Only the first export's resource names a service; the others lack a tenant.
    assert [r[:2] for r in requests(memory_db, result.evidence_id)] == [("r1", "gateway")]
    assert (3, "tenant_id", "required value missing") in rejects(memory_db, result.evidence_id)


LITELLM_1 = (
    "chatcmpl-1",
    "team-a",
    ts("2026-09-08 14:02:00.123456"),
    1200,
    200,
    100,
    128,
    ts("2026-09-08 14:02:00.900"),
    ts("2026-09-08 14:02:03.500"),
    None,
    3377.0,
    "length",
    "glm-5.3",
    None,
    "decode-1",
    None,
    "77",
    "88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778539800c9f1243fe6b4b",
    "198.51.100.4",
    "kvf-canary/1",
)
LITELLM_2 = (
    "chatcmpl-2",
    "team-b",
    ts("2026-09-08 14:03:00"),
    2000000,
    400,
    0,
    None,
    None,
    ts("2026-09-08 14:03:00.200"),
    None,
    None,
    None,
    "glm",
    None,
    None,
    None,
    None,
    "hashed2",
    None,
    None,
)
NO_STATUS = (
    "a failed request without metadata.error_information.error_code: the HTTP status the "
    "client got is not in the log"
)


def test_litellm_json_array_export(memory_db):
    result = ingest_file(memory_db, FORMATS / "spend_logs.json", "requests", "litellm")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (4, 2, 2)
    assert requests(memory_db, result.evidence_id) == [LITELLM_1, LITELLM_2]
    assert rejects(memory_db, result.evidence_id) == [
        (3, None, NO_STATUS),
        (4, None, "not a JSON object"),
    ]
    extra = json.loads(
        memory_db.execute("SELECT extra FROM requests WHERE request_id = 'chatcmpl-1'").fetchone()[
            0
        ]
    )
    assert (extra["call_type"], extra["spend"], extra["cache_hit"]) == (
        "acompletion",
        0.0021,
        "False",
    )


def test_litellm_csv_export_with_json_text_columns_and_crlf(memory_db):
    result = ingest_file(memory_db, FORMATS / "spend_logs.csv", "requests", "auto")
    assert (result.format, result.rows_read, result.rows_loaded, result.rows_rejected) == (
        "litellm",
        4,
        2,
        2,
    )
    # The CSV holds neither request_duration_ms nor response: no e2e_ms, no finish reason.
    expected = [
        LITELLM_1[:10] + (None, None) + LITELLM_1[12:],
        LITELLM_2,
    ]
    assert requests(memory_db, result.evidence_id) == expected
    assert rejects(memory_db, result.evidence_id) == [
        (3, None, NO_STATUS),
        (4, None, "malformed CSV row: expected 16 fields, found 3"),
    ]


def test_litellm_tenant_field_in_metadata(memory_db):
    result = ingest_file(
        memory_db,
        FORMATS / "spend_logs.json",
        "requests",
        "litellm",
        tenant_field="metadata.user_api_key",
    )
    assert [r[:2] for r in requests(memory_db, result.evidence_id)] == [("chatcmpl-1", "hashed1")]


def test_a_format_that_does_not_map_the_kind_is_refused(memory_db):
    with pytest.raises(EvidenceError, match="format 'litellm' maps onto requests, not tenants"):
        ingest_file(memory_db, FORMATS / "spend_logs.json", "tenants", "litellm")


def test_litellm_json_lines_with_a_broken_line_and_zoned_times(memory_db):
    result = ingest_file(memory_db, FORMATS / "spend_logs.jsonl", "requests", "auto")
    assert (result.format, result.rows_read, result.rows_loaded, result.rows_rejected) == (
        "litellm",
        3,
        2,
        1,
    )
    got = memory_db.execute(
        "SELECT request_id, tenant_id, received_at, completed_at, prompt_tokens, http_status "
        "FROM requests ORDER BY source_row"
    ).fetchall()
    # An empty team_id falls back to the key's team in metadata (there a JSON string).
    assert got == [
        ("sl-1", "team-z", ts("2026-09-08 14:00:00"), ts("2026-09-08 14:00:01"), 42, 200),
        ("sl-3", "team-y", ts("2026-09-08 14:05:00"), None, 3, 200),
    ]
    assert rejects(memory_db, result.evidence_id) == [(2, None, "not valid JSON")]


def test_an_export_without_spans_and_an_empty_file(tmp_path, memory_db):
    path = tmp_path / "spans.jsonl"
    path.write_text('{"resourceSpans": []}\n{"resourceSpans": [{"scopeSpans": []}]}\n')
    result = ingest_file(memory_db, path, "requests", "otel")
    assert (result.rows_read, result.rows_loaded) == (2, 0)
    assert rejects(memory_db, result.evidence_id) == [
        (1, None, "an export with no spans"),
        (2, None, "an export with no spans"),
    ]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for fmt in ("otel", "litellm"):
        done = ingest_file(memory_db, empty, "requests", fmt)
        assert (done.rows_read, done.rows_loaded, done.rows_rejected) == (0, 0, 0)


def test_a_span_naming_an_attribute_twice_keeps_the_first_and_loads(tmp_path, memory_db):
    """A map takes each name once: a buggy exporter's repeated or nameless attribute must not
    fail the file (it did, whole), and the value read is the first one given."""

    def attr(key, value):
        return {"key": key, "value": {"stringValue": value}}

    span = {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "name": "chat",
        "startTimeUnixNano": "1788876123000000000",
        "endTimeUnixNano": "1788876124000000000",
        "attributes": [
            attr("gen_ai.response.id", "dup-1"),
            attr("tenant.id", "acct_first"),
            attr("tenant.id", "acct_second"),
            {"value": {"stringValue": "no name"}},
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}},
            attr("custom", "one"),
            attr("custom", "two"),
        ],
    }
    export = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [span]}]}]}
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps(export) + "\n")
    result = ingest_file(memory_db, path, "requests", "otel")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (1, 1, 0)
    [(rid, tenant, prompt, extra)] = memory_db.execute(
        "SELECT request_id, tenant_id, prompt_tokens, extra FROM requests"
    ).fetchall()
    assert (rid, tenant, prompt) == ("dup-1", "acct_first", 10)
    assert json.loads(extra)["attributes"] == {"custom": "one"}
