"""``forensics detect`` and ``forensics explain`` through the CLI, on a simulated case."""

from __future__ import annotations

import csv
import re

import pytest
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner(env={"COLUMNS": "120"})


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli-sim")
    result = runner.invoke(app, ["simulate", str(folder), "--requests", "4000", "--seed", "2"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["ingest", str(folder / "case.toml")])
    assert result.exit_code == 0, result.output
    return folder


def test_detect_prints_every_detector_and_the_verdicts(case_dir):
    result = runner.invoke(app, ["detect", str(case_dir / "case.toml")])
    assert result.exit_code == 0, result.output
    for detector in ("over_pool", "prefill_rejected", "token_mismatch", "latency_too_good"):
        assert detector in result.output
    truth = list(csv.DictReader((case_dir / "truth" / "affected.csv").open()))
    excluded = sum(1 for r in truth if r["excluded_by"])
    assert f"Verdicts: {len(truth)} confirmed, 0 likely, 0 possible ({excluded} of the " in (
        result.output
    )


def test_explain_a_victim_shows_signals_evidence_and_sources(case_dir):
    runner.invoke(app, ["detect", str(case_dir / "case.toml")])
    victim = next(csv.DictReader((case_dir / "truth" / "affected.csv").open()))["request_id"]
    result = runner.invoke(app, ["explain", str(case_dir / "case.toml"), victim])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"Request {victim}" in out
    assert "\n  prefill_rejected: " in out and "Verdict: confirmed (" in out
    assert (
        "    evidence: evidence/requests-2026-" in out and "engine_legs-prefill.parquet row" in out
    )
    assert "allocator_replay (high)" in out


def test_explain_an_unknown_request_is_one_line_exit_1(case_dir):
    result = runner.invoke(app, ["explain", str(case_dir / "case.toml"), "no-such-request"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: request 'no-such-request' is not in this case"


def test_detect_before_ingest_says_what_to_do(tmp_path):
    (tmp_path / "case.toml").write_text('[incident]\nid = "X"\n')
    result = runner.invoke(app, ["detect", str(tmp_path / "case.toml")])
    assert result.exit_code == 1
    assert "no case database yet; run `forensics ingest" in result.output
    assert "Traceback" not in result.output


def test_detect_with_a_bad_manifest_names_the_key(tmp_path):
    (tmp_path / "case.toml").write_text('[incident]\nid = "X"\n[detection]\nlatency_factor = 2\n')
    result = runner.invoke(app, ["detect", str(tmp_path / "case.toml")])
    assert result.exit_code == 1
    assert "[detection].latency_factor" in result.output


def test_explain_an_engine_only_victim_tells_the_engines_story(case_dir, tmp_path):
    """The client log lost a victim's record: explain still shows its legs and signals."""
    import shutil

    from forensics.db import connect

    folder = tmp_path / "lost"
    shutil.copytree(case_dir, folder)
    victim = next(csv.DictReader((folder / "truth" / "affected.csv").open()))["request_id"]
    con = connect(folder / "case.duckdb")
    con.execute("DELETE FROM requests WHERE request_id = ?", [victim])
    con.close()
    assert runner.invoke(app, ["detect", str(folder / "case.toml")]).exit_code == 0
    result = runner.invoke(app, ["explain", str(folder / "case.toml"), victim])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"Request {victim} (tenant unknown)" in out
    assert "no client record: this is the engine's view of the request" in out
    assert "\n  prefill_rejected: " in out and "yet the decode leg completed" in out
    assert "Verdict: confirmed (" in out
    # Its prompt is what its decode leg reserved, judged against its prefill node's limit.
    assert re.search(r"^Limit in force: [\d,]+ tokens on prefill-\d \(from ", out, re.M), out
    assert "\n  over_pool: the prompt (" in out


def test_a_case_folder_stands_for_its_case_toml(case_dir, tmp_path):
    result = runner.invoke(app, ["detect", str(case_dir)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["detect", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {tmp_path.resolve()}: a folder with no case.toml in it"


def test_sql_answers_read_only_questions(case_dir):
    runner.invoke(app, ["detect", str(case_dir)])
    truth = list(csv.DictReader((case_dir / "truth" / "affected.csv").open()))
    query = "SELECT verdict, count(*) AS n FROM findings_affected GROUP BY 1 ORDER BY 1"
    result = runner.invoke(app, ["sql", str(case_dir), query, "--csv"])
    assert result.exit_code == 0, result.output
    assert result.output == f"verdict,n\nconfirmed,{len(truth)}\n"
    result = runner.invoke(
        app, ["sql", str(case_dir), "SELECT request_id FROM requests", "--limit", "3"]
    )
    assert result.exit_code == 0
    assert "rows shown; raise --limit for more" in result.output
    result = runner.invoke(app, ["sql", str(case_dir), "DELETE FROM requests"])
    assert result.exit_code == 1
    assert "read-only" in result.output and "Traceback" not in result.output
    count = runner.invoke(app, ["sql", str(case_dir), "SELECT count(*) FROM requests", "--csv"])
    assert int(count.output.splitlines()[1]) > 0


SIGNAL_ORDER = ["prefill_rejected", "over_pool", "token_mismatch", "latency_too_good"]


def _sql(case_dir, query):
    result = runner.invoke(app, ["sql", str(case_dir), query, "--csv"])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()[1:]


def test_explain_tells_one_story_that_agrees_with_itself(case_dir):
    runner.invoke(app, ["detect", str(case_dir)])
    victim, tenant = next(
        (r["request_id"], r["tenant_id"])
        for r in csv.DictReader((case_dir / "truth" / "affected.csv").open())
        if not r["excluded_by"]
    )
    result = runner.invoke(app, ["explain", str(case_dir), victim])
    assert result.exit_code == 0, result.output
    out = result.output
    lines = out.splitlines()
    assert lines[0] == f"Request {victim} (tenant {tenant}): confirmed"
    assert "None" not in out
    # The decode leg's numbers and the token_mismatch sentence are the same numbers.
    decode = next(line for line in lines if line.startswith("  decode on "))
    node, reserved, received = re.match(
        r"  decode on (\S+) rank \d+: input [\d,]+ tokens, reserved ([\d,]+), received ([\d,]+)$",
        decode,
    ).groups()
    assert (
        f"  token_mismatch: the decode leg on {node} received {received} of the {reserved} "
        "tokens it reserved"
    ) in lines
    assert "reserved not logged" in next(line for line in lines if line.startswith("  prefill on"))
    assert re.search(
        r"^Limit in force: [\d,]+ tokens on \S+ \(from .+ row \d+\); the prompt is "
        r"[\d,]+ tokens over it$",
        out,
        re.M,
    )
    shown = [line.split(":")[0].strip() for line in lines if line.startswith("  ")]
    assert [s for s in shown if s in SIGNAL_ORDER] == SIGNAL_ORDER
    assert (
        "Verdict: confirmed (the prefill logged the input-length rejection, yet the request was "
        "answered)."
    ) in lines
    assert "Its tenant is notified as a recipient." in lines
    # Every exposure the summary counts is listed under it.
    at = next(i for i, line in enumerate(lines) if line.startswith("Read other requests' KV: "))
    count = int(
        re.match(r"Read other requests' KV: ([\d,]+) exposures?", lines[at])[1].replace(",", "")
    )
    listed = [line for line in lines[at + 1 :] if line.startswith("  ")]
    assert len(listed) == count and all(" of acct_" in line for line in listed)
    assert lines[-1] == "Its KV was read by: none"


def test_explain_an_ordinary_request_and_a_source(case_dir):
    runner.invoke(app, ["detect", str(case_dir)])
    source, readers = _sql(
        case_dir,
        "SELECT source_request_id, count(*) FROM findings_exposures "
        "WHERE source_request_id NOT IN (SELECT request_id FROM findings_affected) "
        "AND source_request_id IN (SELECT request_id FROM requests) "
        "AND source_request_id NOT IN (SELECT request_id FROM findings_excluded) "
        "GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1",
    )[0].split(",")
    result = runner.invoke(app, ["explain", str(case_dir), source])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("): not affected")
    assert "Signals: none" in lines
    assert "Verdict: not affected (no detector flagged it)." in lines
    assert "Not excluded by any rule." in lines
    assert re.search(r"the prompt is [\d,]+ tokens under it$", result.output, re.M)
    assert "Read other requests' KV: none" in lines
    at = next(i for i, line in enumerate(lines) if line.startswith("Its KV was read by: "))
    assert re.match(rf"Its KV was read by: {int(readers):,} responses? of \d+ tenants?$", lines[at])
    assert len(lines[at + 1 :]) == int(readers)


def test_the_verdict_reason_names_the_rule_that_applied():
    from forensics.explain import verdict_reason

    params = {"long_prompt_tokens": 65536}

    def reason(verdict, signals, note=None):
        return verdict_reason({"verdict": verdict, "signals": signals, "note": note}, params)

    assert reason("confirmed", "over_pool,prefill_rejected").startswith(
        "the prefill logged the input-length rejection"
    )
    assert reason("confirmed", "latency_too_good,over_pool") == (
        "the prompt was at or over the limit in force, and latency_too_good agrees"
    )
    assert reason("likely", "over_pool").endswith("no engine record refutes it")
    assert reason("likely", "token_mismatch") == (
        "an engine leg held far fewer tokens than a long prompt (at least 65,536 tokens)"
    )
    assert reason("possible", "over_pool", "its prefill leg processed the whole prompt") == (
        "its prefill leg processed the whole prompt"
    )
    assert reason("possible", "latency_too_good") == (
        "latency_too_good alone: a reason to look, not proof of exposure"
    )
    assert reason("likely", "latency_too_good,over_pool_unplaced") == (
        "the prompt was over the limit of some prefill node (which one took it is not on"
        " record), and latency_too_good agrees"
    )
    assert reason("possible", "over_pool_unplaced") == (
        "over_pool_unplaced alone: a reason to look, not proof of exposure"
    )


@pytest.mark.parametrize(
    "cached,expected",
    [
        (None, "about 20,000 ms for a prompt this long (flagged below 4,000.0 ms)"),
        (
            150_000,
            "about 20,000 ms for the 100,000 tokens of this prompt not cached"
            " (flagged below 4,000.0 ms)",
        ),
    ],
)
def test_the_latency_sentence_names_what_prefill_had_to_compute(cached, expected):
    from forensics.commands.detect import _signal_sentence
    from forensics.explain import Explanation

    e = Explanation(
        request={"prompt_tokens": 250_000, "cached_tokens": cached, "http_status": 200},
        parameters={"latency_factor": 0.2},
    )
    signal = {"signal": "latency_too_good", "value": 520.0, "threshold": 4_000.0}
    assert _signal_sentence(signal, e) == (
        "first token after 520.0 ms, where this case's own traffic takes " + expected
    )
