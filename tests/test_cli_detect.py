"""``forensics detect`` and ``forensics explain`` through the CLI, on a simulated case."""

from __future__ import annotations

import csv

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
    assert f"{len(truth)} confirmed" in result.output


def test_explain_a_victim_shows_signals_evidence_and_sources(case_dir):
    runner.invoke(app, ["detect", str(case_dir / "case.toml")])
    victim = next(csv.DictReader((case_dir / "truth" / "affected.csv").open()))["request_id"]
    result = runner.invoke(app, ["explain", str(case_dir / "case.toml"), victim])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"Request {victim}" in out
    assert "Signal prefill_rejected" in out and "Verdict: confirmed" in out
    assert "from engine_legs evidence #" in out
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
    assert "Signal prefill_rejected" in out and "Verdict: confirmed" in out


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
