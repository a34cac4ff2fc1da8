"""What the command line prints: literal evidence, whole lines, tables that fit, honest help.

One small case whose evidence is hostile to a console: a file name, tenant ids, a rejected
value, a decode node (and so a detection warning) and a manifest pattern that all look like
console markup, plus a tenant id carrying a terminal escape sequence. Every command must print
them exactly as the evidence has them.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from forensics.cli import app

FILE = "[red]12 [[evidence]].jsonl"
MISSING = "alloc-[[evidence]]*.csv"
ESCAPE = "evil\x1b[2J"
REJECTION = (
    "Input length (700000 tokens) exceeds the maximum allowed length (681274 tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)


def _requests() -> str:
    def row(rid, tenant, minute, prompt, **kw):
        return {
            "request_id": rid,
            "tenant_id": tenant,
            "received_at": f"2026-08-28T10:{minute:02d}:00Z",
            "completed_at": f"2026-08-28T10:{minute:02d}:30Z",
            "prompt_tokens": prompt,
            "http_status": 200,
            "completion_tokens": 40,
            "prefill_node": "p0",
            "decode_node": "[/]d0",
            **kw,
        }

    rows = [
        row("s", "[[evidence]]", 0, 5000),
        row("v", "[red]12", 1, 700000, bootstrap_room="42", ttft_ms=310.0),
        row("e", ESCAPE, 2, 3000),
        row("bad", "[red]12", 3, "[red]12"),
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


LEGS = [
    {
        "request_id": "v",
        "role": "prefill",
        "node": "p0",
        "started_at": "2026-08-28T10:01:00.1Z",
        "input_tokens": 1,
        "transferred_tokens": 1,
        "bootstrap_room": "42",
        "error": REJECTION,
    },
    {
        "request_id": "v",
        "role": "decode",
        "node": "[/]d0",
        "started_at": "2026-08-28T10:01:00.2Z",
        "input_tokens": 700000,
        "reserved_tokens": 700000,
        "transferred_tokens": 1,
        "bootstrap_room": "42",
    },
]

MANIFEST = f"""[incident]
id = "INC-HOSTILE"
start = "2026-08-28T00:00:00Z"
end = "2026-08-29T00:00:00Z"
context_length = 1048576

[[evidence]]
kind = "requests"
paths = [{json.dumps(glob.escape(FILE))}]

[[evidence]]
kind = "engine_legs"
paths = ["legs.jsonl"]

[[evidence]]
kind = "pool_snapshots"
paths = ["pool.csv"]

[[evidence]]
kind = "kv_allocations"
paths = [{json.dumps(MISSING)}]
"""


def invoke(args: list[str], columns: int = 100):
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(app, args)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The hostile case, run once (`forensics run`); its first output is kept."""
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "case.toml").write_text(MANIFEST)
    (folder / FILE).write_text(_requests())
    (folder / "legs.jsonl").write_text("".join(json.dumps(leg) + "\n" for leg in LEGS))
    (folder / "pool.csv").write_text(
        "node,role,observed_at,max_total_num_tokens,context_length\n"
        "p0,prefill,2026-08-27T00:00:00Z,681280,1048576\n"
    )
    first = invoke(["run", str(folder)], columns=60)
    assert first.exit_code == 1, first.output  # the allocation log pattern matched nothing
    return folder, first.output


def test_run_prints_the_evidence_literally_and_lists_every_warning(hostile):
    folder, out = hostile
    assert "\x1b" not in out
    lines = out.splitlines()
    # Piped at 60 columns, each message is still one whole line.
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert (
        "warning: [/]d0 rank None: no pool snapshot for this decode node, so its pool cannot "
        "be replayed"
    ) in warnings
    assert len(warnings) == 1
    assert "Detection: 1 exposure attributed; 1 warning:" in lines
    assert (
        f"Error: {MISSING}: no file matches this pattern ([[evidence]] #4, kind kv_allocations)"
        in lines
    )
    assert any(line.startswith("Exploitation: ") and line.endswith(".") for line in lines)
    assert any(
        line.startswith("Ingest: 3 files loaded: rows read 7, loaded 6, rejected 1")
        and line.endswith("; 1 did not load whole (listed at the end).")
        for line in lines
    )


def test_a_second_run_says_nothing_new_was_loaded(hostile):
    folder, _ = hostile
    again = invoke(["run", str(folder), "--out", str(folder / "again")], columns=60)
    assert again.exit_code == 1
    assert (
        "Ingest: nothing new: 3 files already loaded (same sha256), skipped; "
        "1 did not load whole (listed at the end)."
    ) in again.output.splitlines()


@pytest.mark.parametrize("columns", [60, 200])
def test_status_shows_file_names_and_rejected_values_as_they_are(hostile, columns):
    folder, _ = hostile
    result = invoke(["status", str(folder)], columns=columns)
    assert result.exit_code == 0, result.output
    out = result.output
    assert FILE in out
    assert "not an integer: '[red]12'" in out
    assert MISSING in out and "([[evidence]] #4, kind kv_allocations)" in out
    if columns == 60:
        # Too narrow for the table: each file is one line, nothing cut.
        assert any(line.startswith(f"{FILE}: kind requests, sha256 ") for line in out.splitlines())
    else:
        assert all(len(line.rstrip()) <= columns for line in out.splitlines())
        header = next(line for line in out.splitlines() if line.startswith("path "))
        assert "first (UTC)" in header and "last (UTC)" in header
        assert "2026-08-28 10:00:00Z" in out


def test_explain_shows_tenant_ids_and_node_names_as_they_are(hostile):
    folder, _ = hostile
    result = invoke(["explain", str(folder), "v"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("Request v (tenant [red]12): confirmed\n")
    assert "  decode on [/]d0: input 700,000 tokens, reserved 700,000, received 1\n" in out
    assert "  s of [[evidence]]: " in out and "temporal (low)" in out
    explained = invoke(["explain", str(folder), "e"])
    assert "Request e (tenant evil\\x1b[2J): not affected" in explained.output
    assert "\x1b" not in explained.output


def test_sql_shows_values_as_they_are(hostile):
    folder, _ = hostile
    result = invoke(
        ["sql", str(folder), "SELECT tenant_id, NULL AS nothing FROM requests ORDER BY 1"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["[[evidence]]", "[red]12", "evil\\x1b[2J"]
    assert all(line.split()[1] == "NULL" for line in lines[1:])
    empty = invoke(["sql", str(folder), "SELECT tenant_id FROM requests WHERE false"])
    assert empty.output.splitlines() == ["tenant_id", "No rows."]


def test_status_json_is_the_library_account(hostile):
    from forensics.case import load_case
    from forensics.db import connect
    from forensics.status import evidence_outcomes

    folder, _ = hostile
    result = invoke(["status", str(folder), "--json"], columns=40)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert sorted(doc) == ["complete", "database", "evidence", "rejects", "spans", "totals"]
    assert doc["complete"] is False
    con = connect(load_case(folder).database, read_only=True)
    outcomes = evidence_outcomes(con)
    con.close()
    assert [(e["path"], e["outcome"]) for e in doc["evidence"]] == [
        (o.path, o.outcome) for o in outcomes
    ]
    missing = next(e for e in doc["evidence"] if e["outcome"] == "missing")
    assert missing == {
        "path": MISSING,
        "kind": "kv_allocations",
        "format": "canonical",
        "outcome": "missing",
        "reason": "no file matches this pattern ([[evidence]] #4, kind kv_allocations)",
        "rows_lost": None,
        "sha256": None,
        "bytes": None,
        "rows_read": None,
        "rows_loaded": None,
        "rows_rejected": None,
        "first_at": None,
        "last_at": None,
        "entry": 4,
    }
    requests = next(e for e in doc["evidence"] if e["kind"] == "requests")
    assert (requests["path"], requests["rows_read"], requests["rows_rejected"]) == (FILE, 4, 1)
    assert requests["first_at"] == "2026-08-28T10:00:00Z"
    assert doc["totals"]["rows_rejected"] == 1
    assert doc["rejects"][0]["example"].endswith("not an integer: '[red]12'")


def test_help_lists_the_commands_in_the_order_of_the_work_each_summary_whole():
    lines = invoke(["--help"], columns=80).output.splitlines()
    commands = lines[lines.index("Commands:") + 1 :]
    names = [line.split()[0] for line in commands]
    work = ["run", "ingest", "status", "detect", "explain", "report", "sql", "simulate"]
    assert names == work + ["gate", "canary"]
    assert not any(line.endswith("...") for line in commands)


def test_help_reads_like_a_command_line():
    for command in ["--help", "run --help", "ingest --help", "explain --help", "status --help"]:
        result = invoke(command.split(), columns=100)
        assert result.exit_code == 0
        assert "<bool>" not in result.output, command
    run = invoke(["run", "--help"]).output
    assert "Usage: forensics run [OPTIONS] {CASE}" in run
    assert "--out DIR" in run and "--as-of TS" in run and "--memory-limit SIZE" in run
    # Help text is not console markup: the manifest's table keeps its name.
    assert "[database].memory_limit" in run
    ingest = invoke(["ingest", "--help"]).output
    assert "--format <canonical|sglang|otel|litellm|cloudflare|auto>" in ingest
    assert "--role <prefill|decode|unified>" in ingest
    assert "--kind <requests|engine_legs|pool_snapshots|kv_allocations|tenants>" in ingest
    assert "{CASE} {REQUEST_ID}" in invoke(["explain", "--help"]).output
    assert "  --json " in invoke(["status", "--help"]).output


def test_help_is_instant_it_imports_no_data_library():
    code = (
        "import sys\n"
        "from forensics.cli import app\n"
        "for args in (['--help'], ['run', '--help'], ['sql', '--help']):\n"
        "    try:\n"
        "        app(args, prog_name='forensics')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('duckdb', 'polars', 'numpy', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "[]"


def test_out_naming_a_file_stops_before_any_work(tmp_path):
    (tmp_path / "case.toml").write_text('[incident]\nid = "X"\n')
    (tmp_path / "taken").write_text("a file")
    result = invoke(["run", str(tmp_path), "--out", str(tmp_path / "taken")])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {tmp_path / 'taken'}: cannot create the folder (a file has its name)\n"
    )
    assert not (tmp_path / "case.duckdb").exists()


def test_ingest_into_a_folder_that_does_not_exist_is_refused(tmp_path):
    data = tmp_path / "r.jsonl"
    data.write_text('{"request_id":"r","tenant_id":"t","received_at":"2026-09-08T14:00:00Z"}\n')
    target = tmp_path / "no" / "such" / "case.duckdb"
    result = invoke(["ingest", str(target), str(data), "--kind", "requests"])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {target}: no folder {target.parent} to create the database in\n"
    )
    assert not (tmp_path / "no").exists()


def test_simulate_lists_its_formats_on_a_bad_one(tmp_path):
    result = invoke(["simulate", str(tmp_path / "sim"), "--format", "helicone"])
    assert result.exit_code == 2
    assert "'helicone' is not one of 'canonical', 'sglang', 'otel', 'litellm'" in result.output
    assert not (tmp_path / "sim").exists()


def test_ctrl_c_during_a_query_is_an_interruption_not_an_error(hostile, monkeypatch):
    import forensics.db

    def interrupted(*args, **kwargs):
        # What DuckDB raises when SIGINT arrives while it runs a query.
        raise RuntimeError("Query interrupted")

    monkeypatch.setattr(forensics.db, "query_case", interrupted)
    folder, _ = hostile
    result = invoke(["sql", str(folder), "SELECT 1"])
    assert result.exit_code == 130
    assert result.output == "Interrupted.\n"
