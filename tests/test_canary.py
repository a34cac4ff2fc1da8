"""``forensics canary`` against the test engine: the leak found, the fixed engine passing, the
TTFT rule of the case detector, records a case can ingest, and every failure as one line."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fixtures.engine_server import Engine, refused_url
from typer.testing import CliRunner

from forensics.canary import (
    CanaryReport,
    Probe,
    Sizing,
    judge,
    plan_targets,
    prompt,
    run_canary,
)
from forensics.cli import app

runner = CliRunner(env={"COLUMNS": "250"})
FAST = ["--rate", "20"]  # the bound is there for live fleets; the test engine is local


def canary(engine_url: str, *args: str):
    return runner.invoke(app, ["canary", engine_url, "--model", "tiny", *FAST, *args])


def test_bug_reproduced_leak_found(tmp_path):
    with Engine(limit=2000, context=4096, bug=True) as engine:
        result = canary(engine.url, "--json", "--out", str(tmp_path))
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["passed"] is False
    kinds = {r["request_id"]: r["kind"] for r in data["requests"]}
    order = [r["request_id"] for r in data["requests"]]
    # Each prompt at or over the limit read the KV of the ordinary prompt just before it.
    assert [(kinds[x["recipient"]], kinds[x["source"]]) for x in data["leaks"]] == [
        ("at", "ordinary"),
        ("over", "ordinary"),
        ("near_context", "ordinary"),
    ]
    for leak in data["leaks"]:
        assert order.index(leak["source"]) == order.index(leak["recipient"]) - 1
    over = [
        r["request_id"] for r in data["requests"] if r["kind"] in ("at", "over", "near_context")
    ]
    assert data["over_limit_answered"] == over
    # Answered at once for thousands of tokens: the case's TTFT rule flags them too.
    assert sorted(f["request_id"] for f in data["ttft_flagged"]) == sorted(over)
    assert data["limit_tokens"] == 2000 and data["limit_source"] == "/get_server_info"
    assert data["context_length"] == 4096 and data["records"].startswith(str(tmp_path))


def test_bug_reproduced_table_names_both_requests():
    with Engine(limit=2000, context=4096, bug=True) as engine:
        result = canary(engine.url)
    assert result.exit_code == 1
    leaks = [line for line in result.output.splitlines() if line.startswith("LEAK: ")]
    assert len(leaks) == 3
    assert "(at, 2,000 tokens) received the marker kvcanary-" in leaks[0]
    assert leaks[0].endswith("(ordinary, 111 tokens)")
    assert "Answered over the limit: " in result.output
    assert "at or over 2,000, got HTTP 200 instead of a 4xx refusal" in result.output
    assert "Canary: FAIL: 3 leaks, 3 over-limit prompts answered." in result.output


def test_fixed_engine_passes():
    with Engine(limit=2000, context=4096, bug=False) as engine:
        result = canary(engine.url)
        seen = list(engine.config.seen)
    assert result.exit_code == 0, result.output
    assert "LEAK" not in result.output and "TTFT too fast" not in result.output
    assert "Canary: pass: no leak; 3 prompts at or over the limit refused." in result.output
    assert result.output.count("refused (HTTP 400)") == 3
    # Streamed, with usage, bounded replies; every prompt its own marker.
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in seen)
    assert all(b["max_tokens"] == 48 for b in seen)
    markers = [b["messages"][0]["content"].split()[1] for b in seen]
    assert len(seen) == 12 and len(set(markers)) == 12


def test_prompts_are_sized_in_the_endpoints_tokens():
    with Engine(limit=2000, context=4096) as engine:
        report = run_canary(engine.url, "tiny", requests=10, rate=20)
    sizes = {p.kind: p.tokens for p in report.probes if p.kind != "ordinary"}
    assert sizes["under"] == 1999
    # Refused prompts report no usage: their size is the calibrated plan, exact here.
    assert [p.prompt_tokens for p in report.probes if p.kind in ("at", "over")] == [None, None]
    assert (sizes["at"], sizes["over"], sizes["near_context"]) == (2000, 2001, 4032)
    assert [p.kind for p in report.probes].count("ordinary") == 4


def test_healthy_engine_whose_limit_is_the_context():
    with Engine(limit=4090, context=4096) as engine:
        report = run_canary(engine.url, "tiny", requests=10, rate=20)
    assert report.passed and not report.ttft_flagged
    # Just under the limit is already near the context: no separate near-context prompt.
    outcome = {p.kind: (report.outcome(p), p.tokens) for p in report.probes}
    assert "near_context" not in outcome
    assert outcome["under"] == ("answered", 4089) and outcome["over"] == (
        "refused (HTTP 400)",
        4091,
    )


def test_impossible_ttft_alone_is_flagged_but_does_not_fail():
    with Engine(limit=2000, context=4096, fast_above=1500) as engine:
        result = canary(engine.url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    flagged = {r["request_id"]: r["kind"] for r in data["requests"] if "TTFT" in r["outcome"]}
    assert list(flagged.values()) == ["under"]
    assert data["ttft_flagged"][0]["detail"].startswith("TTFT ")
    assert data["leaks"] == [] and data["over_limit_answered"] == []


def test_records_are_canonical_requests_a_case_ingests(tmp_path):
    out = tmp_path / "canary"
    with Engine(limit=2000, context=4096, bug=True) as engine:
        result = canary(engine.url, "--out", str(out))
    assert result.exit_code == 1
    (records,) = out.glob("canary-*.jsonl")
    assert records.stat().st_mode & 0o077 == 0
    assert f"Records: {records} (12 requests)" in result.output
    db = tmp_path / "case.duckdb"
    loaded = runner.invoke(app, ["ingest", str(db), str(records), "--kind", "requests"])
    assert loaded.exit_code == 0, loaded.output
    assert "rows read 12, loaded 12, rejected 0" in loaded.output
    from forensics.db import connect

    con = connect(db, read_only=True)
    rows = con.execute(
        """SELECT request_id, tenant_id, http_status, prompt_tokens, ttft_ms, first_token_at,
                  extra->>'canary_kind', extra->>'markers_seen'
           FROM requests ORDER BY request_id"""
    ).fetchall()
    con.close()
    assert {r[1] for r in rows} == {"canary"}
    sent = [json.loads(line) for line in records.read_text().splitlines()]
    assert all(r["filler_words"] >= 0 and r["marker"].startswith("kvcanary-") for r in sent)
    at = next(r for r in rows if r[6] == "at")
    assert (at[2], at[3]) == (200, 2000) and at[4] is not None and at[5] is not None
    assert "kvcanary-" in at[7]


def test_limit_and_context_from_the_options_skip_server_info():
    with Engine(limit=2000, context=4096, fail=None) as engine:
        # The engine refuses at 2,000, but the canary is told 1,500: 1,500 to 1,999 answered.
        result = canary(engine.url, "--limit-tokens", "1500", "--context-length", "4096", "--json")
    data = json.loads(result.output)
    assert result.exit_code == 1
    assert data["limit_source"] == "--limit-tokens"
    kinds = {r["request_id"]: r["kind"] for r in data["requests"]}
    assert sorted(kinds[i] for i in data["over_limit_answered"]) == ["at", "over"]


def test_behind_a_gateway_without_server_info():
    with Engine(limit=2000, context=4096, no_server_info=True) as engine:
        report = run_canary(engine.url, "tiny", limit_tokens=2000, requests=10, rate=20)
        refused = canary(engine.url)
    assert report.passed and report.context_length is None
    assert "near_context" not in [p.kind for p in report.probes]
    assert report.warnings == [
        "no context length known (the endpoint reports none and --context-length was not "
        "given): the near-context prompt was not sent"
    ]
    # Without --limit-tokens there is nothing to straddle.
    assert refused.exit_code == 1
    assert refused.output.strip() == f"Error: {engine.url}/get_server_info: HTTP 404 Not Found"


# --- failures: one line naming the endpoint, exit 1 -----------------------------------------


@pytest.mark.parametrize(
    "options,args,reason",
    [
        ({"fail": "500"}, [], "/get_server_info: HTTP 500 Internal Server Error"),
        (
            {"fail": "not_json"},
            [],
            "/get_server_info: not JSON ('<html><body>maintenance</body></html>')",
        ),
        ({"fail": "hang", "hang_s": 2.0}, ["--timeout", "0.3"], "timed out after 0.3 s"),
        (
            {"fail": "500"},
            ["--limit-tokens", "2000", "--context-length", "4096"],
            "/v1/chat/completions: a 16-word calibration prompt was not answered "
            "(HTTP 500: 'Internal Server Error')",
        ),
        (
            {"fail": "not_json"},
            ["--limit-tokens", "2000", "--context-length", "4096"],
            "/v1/chat/completions: not a chat completion stream ('<html><body>maintenance",
        ),
        (
            {"fail": "bad_stream"},
            [],
            "/v1/chat/completions: not a chat completion stream "
            "('this is not a server-sent event stream')",
        ),
        (
            {"fail": "close"},
            ["--limit-tokens", "2000", "--context-length", "4096"],
            "/v1/chat/completions: the connection closed without an answer",
        ),
        (
            {"fail": "cut"},
            ["--limit-tokens", "2000", "--context-length", "4096"],
            "/v1/chat/completions: the answer was cut off",
        ),
        (
            {"report_limit": False},
            [],
            "/get_server_info: reports no max_req_input_len; give the limit with --limit-tokens",
        ),
        (
            {"usage_tokens": 40},
            [],
            "/v1/chat/completions: prompt_tokens did not grow with the prompt (40 then 40); "
            "cannot size prompts",
        ),
        (
            {"limit": 100},
            [],
            "/get_server_info: max_req_input_len 100 is too small to straddle "
            "(the canary needs at least 512 tokens)",
        ),
        (
            {"no_usage": True},
            [],
            "/v1/chat/completions: reports no usage.prompt_tokens, so prompts cannot be sized",
        ),
    ],
)
def test_endpoint_failures_are_one_line(options, args, reason):
    with Engine(**options) as engine:
        result = canary(engine.url, *args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: {engine.url}")
    assert reason in lines[0]
    assert "Traceback" not in result.output


def test_connection_refused():
    url = refused_url()
    result = canary(url)
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {url}/get_server_info: connection refused"


def test_calibration_records_are_kept_when_it_fails(tmp_path):
    with Engine(usage_tokens=40) as engine:
        result = canary(engine.url, "--out", str(tmp_path))
    assert result.exit_code == 1
    (records,) = tmp_path.glob("canary-*.jsonl")
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(r["canary_kind"], r["prompt_tokens"]) for r in rows] == [
        ("calibration", 40),
        ("calibration", 40),
    ]


def test_records_gathered_before_a_failure_are_kept(tmp_path):
    with Engine(fail="hang", hang_s=2.0, fail_after=5) as engine:
        result = canary(engine.url, "--timeout", "0.5", "--out", str(tmp_path))
    assert result.exit_code == 1
    assert "/v1/chat/completions: timed out after 0.5 s" in result.output
    (records,) = tmp_path.glob("canary-*.jsonl")
    assert len(records.read_text().splitlines()) == 5


# --- usage errors: exit 2 -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["canary", "localhost:30000", "--model", "m"], "not an engine base URL"),
        (["canary", "http://h:1"], "Missing option '--model'"),
        (["canary", "http://h:1", "--model", "m", "--requests", "9"], "not in the range 10 to 64"),
        (["canary", "http://h:1", "--model", "m", "--requests", "65"], "not in the range 10 to 64"),
        (["canary", "http://h:1", "--model", "m", "--rate", "0"], "not above 0 and at most 20"),
        (["canary", "http://h:1", "--model", "m", "--rate", "21"], "not above 0 and at most 20"),
        (
            ["canary", "http://h:1", "--model", "m", "--limit-tokens", "511"],
            "511 is below the smallest limit the canary straddles, 512",
        ),
        (["canary", "http://h:1", "--model", "m", "--timeout", "0"], "--timeout"),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


# --- the parts ------------------------------------------------------------------------------


def test_plan_without_a_context_and_at_the_largest_count():
    plan = plan_targets(10, 681274, None)
    assert [k for k, _ in plan].count("near_context") == 0
    assert [k for k, _ in plan][:6] == ["ordinary", "under", "ordinary", "at", "ordinary", "over"]
    big = plan_targets(64, 681274, 1048576)
    assert len(big) == 62 and big[-1] == ("ordinary", 340637)
    assert [s for k, s in big if k == "near_context"] == [1048512]


@pytest.mark.parametrize("context", [None, 1048576])
def test_every_straddling_prompt_follows_an_ordinary_one(context):
    for count in range(10, 65):
        plan = plan_targets(count, 681274, context)
        assert len(plan) == count - 2
        for i, (kind, _) in enumerate(plan):
            if kind != "ordinary":
                assert i > 0 and plan[i - 1][0] == "ordinary", (count, plan)
        sizes = [size for kind, size in plan if kind == "ordinary"]
        assert sizes == sorted(sizes) and sizes[-1] < 681274 // 2 + 1


def test_sizing_never_crosses_the_limit_the_wrong_way():
    sizing = Sizing(overhead=14.5, per_word=2.0)
    assert sizing.words(2000, "under") == 992  # 1,998.5 tokens: under stays under
    assert sizing.words(2000, "at") == 993  # 2,000.5: at is not a token short
    assert sizing.words(5, "ordinary") == 0


def test_foreign_marker_from_another_run_and_error_in_stream():
    mine = Probe("c-01", "ordinary", 100, "kvcanary-0000000000000001", 0, http_status=200)
    mine.reply = "Code: kvcanary-0000000000000001 and kvcanary-00000000000000ff"
    broken = Probe("c-02", "ordinary", 100, "kvcanary-0000000000000002", 0, http_status=200)
    broken.error = "Internal error"
    report = CanaryReport("http://h", "m", 2000, "--limit-tokens", None, [mine, broken])
    report.probes[0].received_at = report.probes[1].received_at = datetime.now(UTC)
    judge(report)
    (leak,) = report.leaks
    assert leak.source is None and leak.marker == "kvcanary-00000000000000ff"
    assert report.outcome(mine) == "LEAK from elsewhere"
    assert report.outcome(broken) == "error in the stream"
    assert report.warnings == [
        "c-02 (ordinary, 100 tokens) was refused inside an HTTP 200 stream rather than with a "
        "4xx: Internal error"
    ]
    assert not report.passed


def test_prompt_carries_the_marker_first():
    text = prompt("kvcanary-0123456789abcdef", 3)
    assert text.split()[1] == "kvcanary-0123456789abcdef." and text.endswith(" the the the")


@pytest.mark.parametrize("style", ["reasoning", "odd"])
def test_stream_variants_still_find_the_leak(style):
    with Engine(limit=2000, context=4096, bug=True, stream_style=style) as engine:
        report = run_canary(engine.url, "tiny", requests=10, rate=20)
    assert [leak.recipient.kind for leak in report.leaks] == ["at", "over", "near_context"]
    assert all(p.ttft_ms is not None for p in report.probes)
    assert all(p.prompt_tokens is not None for p in report.probes if p.answered)


def test_refusal_inside_a_200_stream_counts_as_refused():
    with Engine(limit=2000, context=4096, bug=True, stream_style="error_event") as engine:
        report = run_canary(engine.url, "tiny", requests=10, rate=20)
    assert report.passed and not report.leaks
    over = [p for p in report.probes if p.kind in ("at", "over", "near_context")]
    assert {report.outcome(p) for p in over} == {"error in the stream"}
    assert {p.error for p in over} == {"Input length exceeds the maximum allowed length"}
    assert len(report.warnings) == 3
    assert report.warnings[0].endswith(
        "was refused inside an HTTP 200 stream rather than with a 4xx: "
        "Input length exceeds the maximum allowed length"
    )


def test_prompt_under_the_stated_limit_refused_is_a_warning():
    with Engine(limit=2000, context=4096) as engine:
        result = canary(engine.url, "--limit-tokens", "3000", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (warning,) = [w for w in data["warnings"] if "(under, 2,999 tokens" in w]
    assert warning.endswith(
        "under the limit of 3,000) was not answered: HTTP 400: Input length (2999 tokens) exceeds "
        "the maximum allowed length (2000 tokens). Use a shorter input or enable "
        "--allow-auto-truncate."
    )


def test_out_that_cannot_be_a_folder_is_one_line(tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("a file")
    with Engine(limit=2000, context=4096) as engine:
        result = canary(engine.url, "--out", str(blocker / "runs"))
        sent = len(engine.config.seen)
    assert result.exit_code == 1 and sent == 0
    assert (
        result.output.strip() == f"Error: {blocker}: cannot create the folder (a file has its name)"
    )
