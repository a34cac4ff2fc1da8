"""``forensics ingest`` (both forms) and ``forensics status`` through the command line."""

from __future__ import annotations

import gzip

from fixtures.damaged import damaged_tiny_case
from typer.testing import CliRunner

from forensics.cli import app

runner = CliRunner()

ROW = (
    '{"request_id":"r%d","tenant_id":"t","received_at":"2026-09-08T14:00:00Z",'
    '"prompt_tokens":%s,"http_status":200}\n'
)


def _jsonl(path, prompts):
    path.write_text("".join(ROW % (i, p) for i, p in enumerate(prompts)))
    return path


def test_ingest_case_then_status(tiny_case_dir):
    manifest = str(tiny_case_dir / "case.toml")
    result = runner.invoke(app, ["ingest", manifest])
    assert result.exit_code == 0, result.output
    assert "requests.jsonl" in result.output and "engine_legs.jsonl" in result.output
    assert "4 loaded, 0 already loaded, 0 failed; rows read 99, loaded 99" in result.output

    # The case folder stands for its case.toml; a second ingest says why nothing was read.
    again = runner.invoke(app, ["ingest", str(tiny_case_dir)])
    assert again.exit_code == 0, again.output
    assert "0 loaded, 4 already loaded (same sha256, skipped), 0 failed; no new rows" in (
        again.output
    )

    status = runner.invoke(app, ["status", manifest])
    assert status.exit_code == 0, status.output
    assert "pool_snapshots.csv" in status.output
    assert "2026-09-08 10:00:00Z" in status.output
    assert "Total: 4 files" in status.output and "No rejected rows." in status.output


def test_file_form_loads_and_reports_rejects(tmp_path):
    db = tmp_path / "case.duckdb"
    data = _jsonl(tmp_path / "r.jsonl", [5, '"12x"', 7])
    result = runner.invoke(app, ["ingest", str(db), str(data), "--kind", "requests"])
    assert result.exit_code == 0, result.output
    assert "loaded, with rejects" in result.output
    assert "rows read 3, loaded 2, rejected 1" in result.output
    # status reads a case, so the hint names the database itself, and a database given to
    # status is named for what it is.
    assert "Rejected rows are in the rejects table of " in result.output
    assert "see `forensics status`" not in result.output
    by_db = runner.invoke(app, ["status", str(db)])
    assert by_db.exit_code == 1
    assert "a DuckDB database, not a case manifest: give the case folder" in by_db.output

    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "X"\n')
    status = runner.invoke(app, ["status", str(manifest)])
    assert status.exit_code == 0, status.output
    assert "not an integer" in status.output and "r.jsonl:2" in status.output


def test_a_failed_file_exits_1_after_loading_the_rest(tmp_path):
    db = tmp_path / "case.duckdb"
    good = _jsonl(tmp_path / "good.jsonl", [1, 2])
    bad = tmp_path / "bad.jsonl.gz"
    # Other request ids than good.jsonl's, so that its rows are no duplicates.
    other = good.read_bytes().replace(b'"request_id":"r', b'"request_id":"s')
    bad.write_bytes(gzip.compress(other)[:-12])
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    args = ["ingest", str(db), str(good), str(bad), str(tmp_path / "broken.parquet")]
    result = runner.invoke(app, [*args, "--kind", "requests"])
    assert result.exit_code == 1
    assert "FAILED" in result.output
    assert f"Error: {tmp_path / 'broken.parquet'}: failed: not a readable Parquet" in result.output
    # The truncated gzip file keeps its complete first line (it used to fail whole).
    assert "PARTIAL" in result.output
    assert (
        f"Error: {bad}: partial (1 row loaded): truncated gzip data after "
        f"{bad.stat().st_size:,} bytes: any rows after line 1 are lost"
    ) in result.output
    assert "2 loaded, 0 already loaded, 1 failed, 1 partial" in result.output


def test_usage_errors_exit_2(tmp_path):
    data = _jsonl(tmp_path / "r.jsonl", [1])
    db = str(tmp_path / "case.duckdb")
    assert runner.invoke(app, ["ingest", db, str(data), "--kind", "request"]).exit_code == 2
    assert runner.invoke(app, ["ingest", db, str(data)]).exit_code == 2
    assert runner.invoke(app, ["ingest", db, "--kind", "requests"]).exit_code == 2
    bad_format = ["ingest", db, str(data), "--kind", "requests", "--format", "xml"]
    assert runner.invoke(app, bad_format).exit_code == 2
    case_with_kind = ["ingest", str(tmp_path / "case.toml"), "--kind", "requests"]
    assert runner.invoke(app, case_with_kind).exit_code == 2
    # An evidence file where the database goes (DuckDB would open it as a view of itself).
    swapped = runner.invoke(app, ["ingest", str(data), str(data), "--kind", "requests"])
    assert swapped.exit_code == 2
    assert f"{data} is not a case database (an evidence file?" in swapped.output
    assert data.read_text() == ROW % (0, 1)


def test_an_unsupported_format_is_a_usage_error_listing_the_supported_ones(tmp_path):
    data = _jsonl(tmp_path / "r.jsonl", [1])
    args = [
        "ingest",
        str(tmp_path / "c.duckdb"),
        str(data),
        "--kind",
        "requests",
        "--format",
        "helicone",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    supported = "'canonical', 'sglang', 'otel', 'litellm', 'cloudflare', 'auto'"
    assert f"'helicone' is not one of {supported}" in result.output
    assert not (tmp_path / "c.duckdb").exists()


def test_status_without_a_database_exits_1(tmp_path):
    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "X"\n')
    result = runner.invoke(app, ["status", str(manifest)])
    assert result.exit_code == 1
    assert "no case database yet" in result.output


def test_manifest_error_exits_1_naming_the_key(tmp_path):
    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "X"\nflavour = 1\n')
    result = runner.invoke(app, ["ingest", str(manifest)])
    assert result.exit_code == 1
    assert "[incident].flavour: unknown key" in result.output


def test_ingest_case_exits_1_naming_each_piece_of_evidence_that_did_not_load_whole(tiny_case_dir):
    manifest = str(damaged_tiny_case(tiny_case_dir))
    size = (tiny_case_dir / "requests.jsonl.gz").stat().st_size
    result = runner.invoke(app, ["ingest", manifest])
    assert result.exit_code == 1
    # Everything else loaded first (the partial file counts as loaded, and as partial).
    assert "4 loaded, 0 already loaded, 0 failed, 1 partial, 1 pattern matching no file" in (
        result.output
    )
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: alloc-*.csv: no file matches this pattern ([[evidence]] #5, kind kv_allocations)",
        f"Error: requests.jsonl.gz: partial (24 rows loaded): truncated gzip data after {size:,} "
        "bytes: any rows after line 24 are lost",
    ]
    # The partial file stays partial on the next run, and the command keeps saying so.
    again = runner.invoke(app, ["ingest", manifest])
    assert again.exit_code == 1
    assert "PARTIAL (already loaded)" in again.output
    assert [line for line in again.output.splitlines() if line.startswith("Error: ")] == errors

    status = runner.invoke(app, ["status", manifest])
    assert status.exit_code == 0, status.output
    assert "Evidence that did not load whole" in status.output
    assert "partial" in status.output and "missing" in status.output
    assert "no file matches this pattern ([[evidence]] #5, kind kv_allocations)" in status.output
    assert "line cut by the damage" in status.output
    assert "The evidence is incomplete: 2 of the files and patterns above" in status.output


def test_a_file_loaded_again_with_other_content_says_both_versions_are_in_the_case(tmp_path):
    db = tmp_path / "case.duckdb"
    data = _jsonl(tmp_path / "r.jsonl", [5, 6])
    first = runner.invoke(app, ["ingest", str(db), str(data), "--kind", "requests"])
    assert first.exit_code == 0 and "loaded before" not in first.output
    # Regenerated in place: one request told differently, one new.
    _jsonl(data, [5, 9, 7])
    again = runner.invoke(app, ["ingest", str(db), str(data), "--kind", "requests"])
    assert again.exit_code == 0, again.output
    text = " ".join(again.output.split())
    assert "rows read 3, loaded 1, rejected 2" in text
    assert "r.jsonl: loaded before with other content (sha256 " in text and "warning: " in text
    assert "If the file was replaced rather than extended, load the evidence into a new case" in (
        text
    )
    # The same content again is skipped as before, with no warning.
    same = runner.invoke(app, ["ingest", str(db), str(data), "--kind", "requests"])
    assert "already loaded" in same.output and "loaded before" not in same.output


def test_run_on_a_case_whose_file_changed_warns_before_detection(tiny_case_dir):
    first = runner.invoke(app, ["run", str(tiny_case_dir), "--out", str(tiny_case_dir / "a")])
    assert first.exit_code == 0, first.output
    legs = tiny_case_dir / "engine_legs.jsonl"
    legs.write_text(legs.read_text().replace('"finish_type": "stop"', '"finish_type": "length"', 1))
    again = runner.invoke(app, ["run", str(tiny_case_dir), "--out", str(tiny_case_dir / "b")])
    text = " ".join(again.output.split())
    assert "warning: engine_legs.jsonl: loaded before with other content (sha256 " in text
    assert text.index("loaded before") < text.index("Detection:")
