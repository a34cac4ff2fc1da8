"""Cloudflare AI Gateway log listings onto requests: exact rows, exact rejects, a whole case."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
import zstandard
from fixtures.adapted import FORMATS, rejects, rows, ts
from typer.testing import CliRunner

from forensics.adapters import sniff
from forensics.cli import app
from forensics.ingest import ingest_file

COLUMNS = (
    "request_id, tenant_id, received_at, prompt_tokens, http_status, completion_tokens, "
    "cached_tokens, first_token_at, completed_at, ttft_ms, e2e_ms, finish_reason, model, "
    "prefill_node, decode_node, dp_rank, bootstrap_room, api_key_id, client_ip, user_agent"
)
CACHED = (
    "answered from the AI Gateway cache (cached: true), not by an engine: a copy of an earlier "
    "response to the same request"
)
BAD_METADATA = "metadata is not a JSON object: its tenant_id (the tenant) cannot be read"


def requests(con, evidence_id: int) -> list[tuple]:
    return rows(con, "requests", COLUMNS, evidence_id)


def extra(con, request_id: str) -> dict:
    sql = "SELECT extra FROM requests WHERE request_id = ?"
    [(text,)] = con.execute(sql, [request_id]).fetchall()
    return json.loads(text)


def counts(result) -> tuple[int, int, int]:
    assert result.rows_read == result.rows_loaded + result.rows_rejected
    return result.rows_read, result.rows_loaded, result.rows_rejected


def request(request_id, tenant, received, prompt, status, completion, completed, e2e, **named):
    """A canonical row as the adapter fills it (no first token, finish reason or client IP)."""
    by_name = [named.get(n) for n in ("prefill_node", "decode_node", "dp_rank", "bootstrap_room")]
    return (
        (request_id, tenant, ts(received), prompt, status, completion, None, None)
        + (ts(completed), None, e2e, None, "glm-5.3", *by_name)
        + (named.get("api_key_id"), None, named.get("user_agent"))
    )


# The metadata a JSON string (as the REST API writes it), then an object; numbers as strings,
# an offset, a naive time and a fractional duration.
LOG_A = request(
    "01J7Z0A4QW6V3K8M2N5P9R1T7Y",
    "acct_1",
    "2026-09-08 14:02:00.250",
    712345,
    200,
    12,
    "2026-09-08 14:02:02.750",
    2500.0,
    decode_node="decode-0",
    bootstrap_room="7200000000000007919",
)
LOG_B = request(
    "01J7Z0B8XK2M4N6P8R0T2V4W6Y",
    "acct_2",
    "2026-09-08 14:05:00",
    900,
    429,
    0,
    "2026-09-08 14:05:00.350",
    350.0,
    prefill_node="prefill-0",
    dp_rank=1,
    api_key_id="key_2",
    user_agent="sdk/1.2",
)
LOG_F = request(
    "01J7Z0F4NAIVE000000000000",
    "42",
    "2026-09-08 14:10:00",
    1000,
    200,
    7,
    "2026-09-08 14:10:01.000500",
    1000.5,
)


def test_one_pretty_printed_page(memory_db):
    result = ingest_file(memory_db, FORMATS / "cloudflare-page-1.json", "requests", "cloudflare")
    assert counts(result) == (6, 3, 3)
    assert requests(memory_db, result.evidence_id) == [LOG_A, LOG_B, LOG_F]
    assert rejects(memory_db, result.evidence_id) == [
        (3, None, CACHED),
        (4, "prompt_tokens", "required value missing"),
        (5, None, BAD_METADATA),
    ]
    # What is not mapped stays, the metadata parsed and without the keys that were mapped.
    assert extra(memory_db, LOG_A[0]) == {
        "provider": "custom-sglang",
        "model_type": "chat",
        "path": "v1/chat/completions",
        "request_type": "universal",
        "request_content_type": "application/json",
        "response_content_type": "text/event-stream",
        "success": True,
        "cached": False,
        "step": 0,
        "cost": 0.0042,
        "custom_cost": False,
        "request_size": 2849380,
        "request_head": '{"model":"glm-5.3","messages":[{"role":"user","content":"Summarise the',
        "request_head_complete": False,
        "response_size": 1840,
        "response_head": 'data: {"id":"chatcmpl-1","object":"chat.completion.chunk"',
        "response_head_complete": False,
        "metadata": {"user": "u9"},
    }
    assert "metadata" not in extra(memory_db, LOG_B[0])
    # A rejected log is kept whole, as the listing gave it.
    [(raw,)] = memory_db.execute(
        "SELECT raw FROM rejects WHERE source_row = 3 AND evidence_id = ?", [result.evidence_id]
    ).fetchall()
    assert json.loads(raw)["id"] == "01J7Z0C1CACHEDHIT00000000"


P1 = request(
    "log-p1", "acct_1", "2026-09-08 15:00:00", 30000, 200, 100, "2026-09-08 15:00:00.800", 800.0
)
P2 = request(
    "log-p2", "acct_2", "2026-09-08 15:01:00.500", 64000, 200, 80, "2026-09-08 15:01:01.700", 1200.0
)
P3 = request("log-p3", "acct_3", "2026-09-08 15:03:00", 5, 500, 1, "2026-09-08 15:03:00", 0.0)
PAGES_REJECTS = [
    (3, None, 'a failed page (success: false), first error: "Authentication error" (code 10000)'),
    (4, None, "not valid JSON"),
    (5, None, "a page whose result is not a list of logs"),
    (
        7,
        "request_id",
        "exact duplicate: same content as {path}:1, which is loaded",
    ),
    (8, None, "a log that is not a JSON object"),
]


def pages_rejects(path) -> list[tuple]:
    return [(row, column, reason.format(path=path)) for row, column, reason in PAGES_REJECTS]


def test_pages_one_per_line(memory_db):
    # CRLF lines: two logs, a failed page, an empty page (no record), a cut line, a page whose
    # result is no list, then a page that repeats a log of page 1 (the listing moved while it
    # was paged) beside a new one and a number.
    path = FORMATS / "cloudflare-pages.jsonl"
    result = ingest_file(memory_db, path, "requests", "cloudflare")
    assert counts(result) == (8, 3, 5)
    assert requests(memory_db, result.evidence_id) == [P1, P2, P3]
    assert rejects(memory_db, result.evidence_id) == pages_rejects(path)
    assert extra(memory_db, "log-p2")["metadata"] == {"user": "bob"}


@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_compressed_pages_read_the_same(tmp_path, memory_db, codec):
    data = (FORMATS / "cloudflare-pages.jsonl").read_bytes()
    path = tmp_path / f"pages.jsonl.{codec}"
    compress = {"gz": gzip.compress, "zst": zstandard.ZstdCompressor().compress}[codec]
    path.write_bytes(compress(data))
    result = ingest_file(memory_db, path, "requests", "auto")
    assert (result.format, *counts(result)) == ("cloudflare", 8, 3, 5)
    assert requests(memory_db, result.evidence_id) == [P1, P2, P3]
    assert rejects(memory_db, result.evidence_id) == pages_rejects(path)


Q1 = request(
    "log-q1",
    "acct_4",
    "2026-09-08 15:10:00",
    2000,
    200,
    50,
    "2026-09-08 15:10:00.500",
    500.0,
    decode_node="decode-1",
)
Q2 = request(
    "log-q2", "acct_5", "2026-09-08 15:11:00", 3000, 200, 60, "2026-09-08 15:11:00.700", 700.0
)


def test_logs_without_pages_as_an_array_and_as_lines(memory_db):
    array = ingest_file(memory_db, FORMATS / "cloudflare-logs.json", "requests", "cloudflare")
    assert counts(array) == (3, 2, 1)
    assert requests(memory_db, array.evidence_id) == [Q1, Q2]
    assert rejects(memory_db, array.evidence_id) == [(3, None, "not a JSON object")]
    # The same two logs, one per line, then an array line of two numbers (two records).
    lines = ingest_file(memory_db, FORMATS / "cloudflare-logs.jsonl", "requests", "auto")
    assert (lines.format, *counts(lines)) == ("cloudflare", 4, 0, 4)
    kept = f"{FORMATS / 'cloudflare-logs.json'}"
    assert rejects(memory_db, lines.evidence_id) == [
        (1, "request_id", f"exact duplicate: same content as {kept}:1, which is loaded"),
        (2, "request_id", f"exact duplicate: same content as {kept}:2, which is loaded"),
        (3, None, "not a JSON object"),
        (4, None, "not a JSON object"),
    ]


@pytest.mark.parametrize("field", ["tenant_id", "metadata.tenant_id"])
def test_the_default_tenant_key_named_either_way(memory_db, field):
    path = FORMATS / "cloudflare-page-1.json"
    result = ingest_file(memory_db, path, "requests", "cloudflare", tenant_field=field)
    assert requests(memory_db, result.evidence_id) == [LOG_A, LOG_B, LOG_F]


def test_tenant_field_names_another_metadata_key(memory_db):
    path = FORMATS / "cloudflare-page-1.json"
    result = ingest_file(memory_db, path, "requests", "cloudflare", tenant_field="metadata.user")
    assert [r[:2] for r in requests(memory_db, result.evidence_id)] == [(LOG_A[0], "u9")]
    assert rejects(memory_db, result.evidence_id) == [
        (2, "tenant_id", "required value missing"),
        (3, None, CACHED),
        (4, "tenant_id", "required value missing"),
        (5, None, "metadata is not a JSON object: its user (the tenant) cannot be read"),
        (6, "tenant_id", "required value missing"),
    ]
    # The key that held the tenant is mapped; tenant_id is left in the metadata kept.
    assert extra(memory_db, LOG_A[0])["metadata"] == {"tenant_id": "acct_1"}


def test_tenant_field_names_a_field_of_the_log(memory_db):
    path = FORMATS / "cloudflare-page-1.json"
    result = ingest_file(memory_db, path, "requests", "cloudflare", tenant_field="provider")
    got = [r[:2] for r in requests(memory_db, result.evidence_id)]
    # Metadata that is no object no longer hides the tenant: that log loads, its text kept.
    assert got == [
        (LOG_A[0], "custom-sglang"),
        (LOG_B[0], "openai"),
        ("01J7Z0E3BADMETA0000000000", "custom-sglang"),
        (LOG_F[0], "custom-sglang"),
    ]
    assert extra(memory_db, "01J7Z0E3BADMETA0000000000")["metadata"] == "tenant=acct_3"
    assert "provider" not in extra(memory_db, LOG_A[0])


def test_an_empty_page_an_empty_file_and_a_failed_page_alone(tmp_path, memory_db):
    empty_page = tmp_path / "empty-page.json"
    empty_page.write_text(
        '{"success": true, "errors": [], "messages": [], "result": [],\n'
        ' "result_info": {"page": 1, "per_page": 50, "count": 0, "total_count": 0}}\n'
    )
    empty_file = tmp_path / "empty.json"
    empty_file.write_text("\n")
    for path in (empty_page, empty_file):
        done = ingest_file(memory_db, path, "requests", "cloudflare")
        assert counts(done) == (0, 0, 0)
    failed = tmp_path / "failed.json"
    failed.write_text('{"success": false, "errors": [], "messages": [], "result": null}')
    done = ingest_file(memory_db, failed, "requests", "cloudflare")
    assert counts(done) == (1, 0, 1)
    assert rejects(memory_db, done.evidence_id) == [
        (1, None, "a failed page (success: false) without an error")
    ]


CLOUDFLARE_FIXTURES = sorted(FORMATS.glob("cloudflare-*"))


@pytest.mark.parametrize("path", CLOUDFLARE_FIXTURES, ids=lambda p: p.name)
def test_auto_finds_a_listing(path):
    assert sniff(path) == (
        "cloudflare",
        "a Cloudflare AI Gateway log listing (created_at, duration, cached, provider)",
    )


OTHERS = [
    p
    for p in [*FORMATS.iterdir(), *(FORMATS.parent / "tiny_case").iterdir()]
    if not p.name.startswith("cloudflare-") and p.suffix != ".md"
]


@pytest.mark.parametrize("path", OTHERS, ids=lambda p: p.name)
def test_auto_does_not_take_other_formats_for_a_listing(path):
    assert sniff(path)[0] != "cloudflare"


# --- a whole case ---------------------------------------------------------------------------

AFFECTED = "SELECT request_id, tenant_id, verdict, excluded_by FROM findings_affected"
EXPOSURES = (
    "SELECT recipient_request_id, recipient_tenant_id, source_request_id, source_tenant_id, "
    "method, tokens FROM findings_exposures"
)
METADATA = ("tenant_id", "decode_node", "dp_rank", "bootstrap_room", "api_key_id")


def as_gateway_log(row: dict) -> dict:
    """A canonical request of the tiny case as the gateway logs it (5 metadata entries)."""
    received, completed = (row[k].replace("Z", "+00:00") for k in ("received_at", "completed_at"))
    from datetime import datetime

    duration = datetime.fromisoformat(completed) - datetime.fromisoformat(received)
    metadata = {k: row[k] for k in METADATA if k in row}
    return {
        "id": row["request_id"],
        "provider": "custom-sglang",
        "model": row["model"],
        "path": "v1/chat/completions",
        "duration": round(duration.total_seconds() * 1000),
        "status_code": row["http_status"],
        "success": row["http_status"] == 200,
        "cached": False,
        "tokens_in": row["prompt_tokens"],
        "tokens_out": row["completion_tokens"],
        "metadata": json.dumps(metadata),
        "created_at": row["received_at"],
    }


def test_a_case_whose_client_record_is_the_gateway_finds_what_the_canonical_one_does(
    tmp_path, tiny_reference
):
    import duckdb

    folder = tmp_path / "gateway_case"
    shutil.copytree(
        tiny_reference.parent, folder, ignore=shutil.ignore_patterns("*.duckdb*", "report")
    )
    logs = [
        as_gateway_log(json.loads(line))
        for line in (folder / "requests.jsonl").read_text().splitlines()
    ]
    (folder / "requests.jsonl").unlink()
    with open(folder / "gateway-logs.jsonl", "w") as out:
        for n, start in enumerate(range(0, len(logs), 10), 1):
            page = {
                "success": True,
                "errors": [],
                "messages": [],
                "result": logs[start : start + 10],
                "result_info": {"page": n, "per_page": 10, "total_count": len(logs)},
            }
            out.write(json.dumps(page) + "\n")
    manifest = folder / "case.toml"
    text = manifest.read_text()
    canonical = 'kind = "requests"\nformat = "canonical"\npaths = ["requests.jsonl"]'
    assert canonical in text
    manifest.write_text(
        text.replace(
            canonical, 'kind = "requests"\nformat = "cloudflare"\npaths = ["gateway-logs.jsonl"]'
        )
    )
    result = CliRunner().invoke(app, ["run", str(manifest)])
    assert result.exit_code == 0, result.output
    got = duckdb.connect(str(folder / "case.duckdb"), read_only=True)
    want = duckdb.connect(str(tiny_reference.parent / "case.duckdb"), read_only=True)
    try:
        loaded = got.execute(
            "SELECT format, rows_read, rows_loaded FROM evidence WHERE kind = 'requests'"
        )
        assert loaded.fetchall() == [("cloudflare", len(logs), len(logs))]
        affected = set(want.execute(AFFECTED).fetchall())
        assert affected, "the tiny case has affected responses"
        assert set(got.execute(AFFECTED).fetchall()) == affected
        assert set(got.execute(EXPOSURES).fetchall()) == set(want.execute(EXPOSURES).fetchall())
    finally:
        got.close()
        want.close()


def test_cli_ingest_reads_the_format(tmp_path):
    database = tmp_path / "c.duckdb"
    args = ["ingest", str(database), str(FORMATS / "cloudflare-pages.jsonl")]
    result = CliRunner().invoke(app, [*args, "--kind", "requests", "--format", "cloudflare"])
    assert result.exit_code == 0, result.output
    import duckdb

    con = duckdb.connect(str(database), read_only=True)
    try:
        assert con.execute(
            "SELECT format, rows_read, rows_loaded, rows_rejected FROM evidence"
        ).fetchall() == [("cloudflare", 8, 3, 5)]
    finally:
        con.close()
