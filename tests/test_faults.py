"""Faults of the machine, not of the evidence: a kill at any stage, two commands on one case, a
memory limit far below the data. Each ends in a whole result or one line, never a cut one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from forensics.case import load_case
from forensics.cli import app
from forensics.db import connect
from forensics.errors import ManifestError

TINY = Path(__file__).parent / "fixtures" / "tiny_case"
runner = CliRunner(env={"COLUMNS": "200"})

# Runs the command line in a child process with one function wrapped: on its n-th call the
# wrapper kills the process with SIGKILL, after the call (or before it, for os.replace: the
# file is complete but not yet in place), or holds it until a file appears.
CHILD = textwrap.dedent(
    """
    import importlib, os, signal, sys, time
    from pathlib import Path

    module_name, name, when, n, flag = sys.argv[1:6]
    module = importlib.import_module(module_name)
    original, calls = getattr(module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == int(n) and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        if len(calls) == int(n) and when == "hold":
            Path(flag + ".ready").touch()
            while not Path(flag + ".go").exists():
                time.sleep(0.05)
        result = original(*args, **kwargs)
        if len(calls) == int(n) and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(module, name, wrapped)
    sys.argv = ["forensics", *sys.argv[6:]]
    from forensics.cli import main

    main()
    """
)


def child(target: str, when: str, n: int, *args: str, flag: str = "", wait: bool = True):
    """The command line in a child process, ``target`` ("module:function") wrapped."""
    module, name = target.split(":")
    command = [sys.executable, "-c", CHILD, module, name, when, str(n), flag, *args]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # The common umask: the command line itself must make what it writes private.
        preexec_fn=lambda: os.umask(0o022),
    )
    if wait:
        proc.communicate(timeout=120)
    return proc


def copy_case(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(TINY, folder, ignore=shutil.ignore_patterns("*.duckdb*"))
    return folder / "case.toml"


def outputs(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def loaded(manifest: Path) -> list[tuple]:
    con = duckdb.connect(str(manifest.parent / "case.duckdb"), read_only=True)
    try:
        return con.execute(
            "SELECT path, rows_read, rows_loaded, rows_rejected, "
            "(SELECT count(*) FROM rejects r WHERE r.evidence_id = e.evidence_id) "
            "FROM evidence e ORDER BY path"
        ).fetchall()
    finally:
        con.close()


def test_a_kill_at_any_stage_then_a_run_gives_the_same_bytes(tmp_path, tiny_reference):
    reference = tiny_reference
    expected = outputs(reference.parent / "report")
    case = copy_case(tmp_path, "killed")
    out = case.parent / "report"

    # Mid-file: the second file's rows are in, its repeats judged but not yet rejected, no
    # commit.
    killed = child("forensics.repeats:may_repeat", "after", 2, "run", str(case))
    assert killed.returncode == -signal.SIGKILL
    # DuckDB's write-ahead log, left by the kill, holds evidence: private too.
    wal = case.parent / "case.duckdb.wal"
    assert stat.S_IMODE(wal.stat().st_mode) == 0o600
    assert [row[0] for row in loaded(case)] == ["requests.jsonl"]
    con = duckdb.connect(str(case.parent / "case.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM engine_legs").fetchone() == (0,)
    con.close()

    # Mid-detection: attribution written, exploitation and coverage not yet.
    killed = child("forensics.attribution:attribute", "after", 1, "run", str(case))
    assert killed.returncode == -signal.SIGKILL
    assert loaded(case) == loaded(reference)
    con = duckdb.connect(str(case.parent / "case.duckdb"), read_only=True)
    # Detection ran in one transaction: nothing of it remains.
    tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'findings%'")
    assert tables.fetchall() == []
    con.close()

    # Mid-report: two outputs in place, the third complete under its temporary name.
    killed = child("os:replace", "before", 3, "run", str(case))
    assert killed.returncode == -signal.SIGKILL
    present = outputs(out)
    partial = [n for n in present if n.startswith(".notifications.csv.") and n.endswith(".partial")]
    assert len(partial) == 1
    assert sorted(set(present) - set(partial)) == [
        "affected_responses.csv",
        "exposures.csv",
    ]  # no manifest.json: the folder does not pass for a whole report
    for name in ("affected_responses.csv", "exposures.csv"):
        assert present[name] == expected[name]

    again = runner.invoke(app, ["run", str(case)])
    assert again.exit_code == 0, again.output
    assert outputs(out) == expected
    assert loaded(case) == loaded(reference)
    assert all(read == rows + rejected for _, read, rows, rejected, _ in loaded(case))


def test_two_ingests_of_one_case_never_mix(tmp_path):
    case = copy_case(tmp_path, "case")
    flag = str(tmp_path / "first")
    first = child(
        "forensics.ingest:_load_all", "hold", 1, "ingest", str(case), flag=flag, wait=False
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(flag + ".ready").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = runner.invoke(app, ["ingest", str(case)])
        assert second.exit_code == 1
        assert second.output == (
            f"Error: {case.parent / 'case.duckdb'}: the case database is in use by another "
            f"process (process {first.pid}); wait for it to finish (one command at a time on "
            "a case)\n"
        )
    finally:
        Path(flag + ".go").touch()
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert "4 loaded, 0 already loaded, 0 failed; rows read 99, loaded 99" in stdout
    again = runner.invoke(app, ["ingest", str(case)])
    assert again.exit_code == 0
    assert "0 loaded, 4 already loaded" in again.output
    assert [row[2] for row in loaded(case)] == [60, 3, 31, 5]


# --- memory -----------------------------------------------------------------------------------


def _requests_parquet(path: Path, rows: int) -> Path:
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    try:
        from bench_ingest import GENERATE
    finally:
        sys.path.pop(0)
    con = duckdb.connect()
    con.execute(GENERATE.format(rows=rows, path=str(path)))
    con.close()
    return path


@pytest.fixture(scope="module")
def big_parquet(tmp_path_factory) -> Path:
    """300,000 requests: as text, more than twice the 64 MB limit used below."""
    return _requests_parquet(tmp_path_factory.mktemp("big") / "requests.parquet", 300_000)


def test_a_memory_limit_far_below_the_data_completes(tmp_path, big_parquet):
    db = tmp_path / "case.duckdb"
    args = ["ingest", str(db), str(big_parquet), "--kind", "requests", "--memory-limit", "64MB"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "rows read 300,000, loaded 300,000, rejected 0" in result.output
    con = connect(db, memory_limit="64MB")
    text = con.execute("SELECT sum(length(CAST(r AS VARCHAR))) FROM requests r").fetchone()[0]
    assert text > 2 * 64 * 2**20
    assert con.execute("SELECT current_setting('temp_directory')").fetchone() == (f"{db}.tmp",)
    con.close()


def _limit(con) -> str:
    """The memory limit a connection runs under, as DuckDB shows it."""
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def _shown_as(limit: str) -> str:
    """How DuckDB shows ``limit`` once set (a rounded size in its own units)."""
    import duckdb

    reference = duckdb.connect()
    reference.execute(f"SET memory_limit = '{limit}'")
    text = _limit(reference)
    reference.close()
    return text


def test_a_case_database_is_capped_by_default_and_a_limit_given_wins(tmp_path):
    from forensics.db import DEFAULT_MEMORY_LIMIT

    capped = _shown_as(DEFAULT_MEMORY_LIMIT)
    con = connect(tmp_path / "case.duckdb")
    assert _limit(con) == capped
    con.close()
    con = connect(tmp_path / "case.duckdb", memory_limit="64MB")
    assert _limit(con) == _shown_as("64MB")
    con.close()
    memory = connect(":memory:")
    assert _limit(memory) != capped  # an in-memory case keeps DuckDB's own limit
    memory.close()


def test_a_large_case_database_gets_the_larger_default_on_a_machine_with_room(
    tmp_path, monkeypatch
):
    import os

    from forensics import db as db_module
    from forensics.case import memory_bytes
    from forensics.db import DEFAULT_MEMORY_LIMIT, LARGE_CASE_LIMIT, default_memory_limit

    real = os.sysconf
    room = 4 * memory_bytes(LARGE_CASE_LIMIT) // real("SC_PAGE_SIZE")  # pages of 4x the limit

    def machine(pages: int) -> None:
        monkeypatch.setattr(
            os, "sysconf", lambda name: pages if name == "SC_PHYS_PAGES" else real(name)
        )

    machine(room + 1)
    big = tmp_path / "big.duckdb"
    with open(big, "wb") as f:
        f.truncate(db_module.LARGE_CASE_BYTES)  # sparse: its size counts, not its blocks
    assert default_memory_limit(big) == LARGE_CASE_LIMIT
    with open(big, "r+b") as f:
        f.truncate(db_module.LARGE_CASE_BYTES - 1)
    assert default_memory_limit(big) == DEFAULT_MEMORY_LIMIT
    assert default_memory_limit(tmp_path / "absent.duckdb") == DEFAULT_MEMORY_LIMIT
    with open(big, "r+b") as f:
        f.truncate(db_module.LARGE_CASE_BYTES)
    machine(room - 1)  # less than four times the larger limit: the smaller one
    assert default_memory_limit(big) == DEFAULT_MEMORY_LIMIT

    # connect() applies it, and a limit given still wins.
    machine(room + 1)
    path = tmp_path / "case.duckdb"
    connect(path).close()
    con = connect(path)
    assert _limit(con) == _shown_as(DEFAULT_MEMORY_LIMIT)
    con.close()
    monkeypatch.setattr(db_module, "LARGE_CASE_BYTES", 1)
    con = connect(path)
    assert _limit(con) == _shown_as(LARGE_CASE_LIMIT)
    con.close()
    con = connect(path, memory_limit="64MB")
    assert _limit(con) == _shown_as("64MB")
    con.close()


def test_a_memory_limit_too_small_is_one_line_and_records_nothing(tmp_path, big_parquet):
    db = tmp_path / "case.duckdb"
    args = ["ingest", str(db), str(big_parquet), "--kind", "requests"]
    result = runner.invoke(app, [*args, "--memory-limit", "8MB"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith(
        f"Error: {big_parquet}: out of memory under the database memory limit "
        "(Out of Memory Error: "
    )
    assert lines[0].endswith(
        "); raise [database].memory_limit in the manifest or pass a larger --memory-limit"
    )
    con = connect(db)
    # The file is not to blame: nothing is recorded against it, and nothing of it is loaded.
    assert con.execute("SELECT count(*) FROM evidence_failures").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (0,)
    con.close()
    assert runner.invoke(app, args).exit_code == 0


def same_report(folder: Path, reference: Path) -> bool:
    """Whether two reports are the same but for the manifest they were run from."""
    got, want = outputs(folder), outputs(reference)
    manifests = [json.loads(x.pop("manifest.json")) for x in (got, want)]
    for m in manifests:
        m["case"].pop("manifest_sha256")
    return got == want and manifests[0] == manifests[1]


@pytest.mark.parametrize("target", ["forensics.coverage:assess", "forensics.db:publish_findings"])
def test_a_detection_killed_leaves_the_previous_findings_whole(tmp_path, tiny_reference, target):
    # Detection writes temporary tables and publishes them in one transaction at the end: a
    # kill before the publish, mid-detection or just before it, leaves the findings and scope
    # of the run before, which a report still reads.
    case = copy_case(tmp_path, "again")
    assert runner.invoke(app, ["run", str(case)]).exit_code == 0
    killed = child(target, "before", 1, "detect", str(case))
    assert killed.returncode == -signal.SIGKILL
    report = runner.invoke(app, ["report", str(case), "--out", str(tmp_path / "after")])
    assert report.exit_code == 0, report.output
    assert same_report(tmp_path / "after", tiny_reference.parent / "report")


def test_publishing_before_detection_wrote_anything_is_refused(tmp_path, tiny_reference):
    from forensics.db import connect, publish_findings

    case = copy_case(tmp_path, "unstaged")
    assert runner.invoke(app, ["run", str(case)]).exit_code == 0
    con = connect(case.parent / "case.duckdb")
    before = con.execute("SELECT count(*) FROM findings_affected").fetchone()
    with pytest.raises(RuntimeError, match="no findings to publish"):
        publish_findings(con)
    assert con.execute("SELECT count(*) FROM findings_affected").fetchone() == before
    assert before[0] > 0
    con.close()


def test_detection_under_a_memory_limit(tmp_path, tiny_reference):
    reference = tiny_reference
    case = copy_case(tmp_path, "limited")
    limited = 'path = "case.duckdb"\nmemory_limit = "48MB"'
    case.write_text(case.read_text().replace('path = "case.duckdb"', limited))
    assert load_case(case).memory_limit == "48MB"
    result = runner.invoke(app, ["run", str(case)])
    assert result.exit_code == 0, result.output
    assert same_report(case.parent / "report", reference.parent / "report")
    # Far too small for detection: one line, and the findings of the run above stay (findings
    # are replaced in one transaction).
    failed = runner.invoke(app, ["detect", str(case), "--memory-limit", "1MB"])
    assert failed.exit_code == 1
    assert failed.output.startswith("Error: out of memory under the database memory limit (")
    assert len(failed.output.splitlines()) == 1
    report = runner.invoke(app, ["report", str(case), "--out", str(tmp_path / "after")])
    assert report.exit_code == 0
    assert same_report(tmp_path / "after", reference.parent / "report")


def test_out_of_memory_under_a_large_limit_says_a_smaller_one_can_complete(tmp_path, monkeypatch):
    # What DuckDB said when detecting 100M requests under an 11.7 GB limit, where 2 GB
    # completes: it planned in memory a join it could not then spill.
    said = (
        "Out of Memory Error: failed to pin block of size 256.0 KiB (11.7 GiB/11.7 GiB used)"
        "\n\nPossible solutions:\n* Reducing the number of threads (SET threads=X)"
    )

    def out_of_memory(*args, **kwargs):
        raise duckdb.OutOfMemoryException(said)

    import forensics.pipeline

    case = copy_case(tmp_path, "case")
    assert runner.invoke(app, ["ingest", str(case)]).exit_code == 0
    monkeypatch.setattr(forensics.pipeline, "detect_and_scope", out_of_memory)
    failed = runner.invoke(app, ["detect", str(case), "--memory-limit", "12GB"])
    assert failed.exit_code == 1
    assert failed.output.splitlines() == [
        "Error: out of memory under the database memory limit (Out of Memory Error: failed to"
        " pin block of size 256.0 KiB (11.7 GiB/11.7 GiB used)); the limit is above 2GB, where"
        " DuckDB plans in memory what it expects to fit and may then not spill it: a smaller"
        " one such as 2GB ([database].memory_limit in the manifest or --memory-limit) can"
        " complete where a larger one fails"
    ]


def test_a_memory_limit_must_be_a_size(tmp_path):
    case = copy_case(tmp_path, "case")
    bad = runner.invoke(app, ["run", str(case), "--memory-limit", "lots"])
    assert bad.exit_code == 2
    assert "not a memory size such as '1GB' or '512MB': 'lots'" in bad.output
    case.write_text(case.read_text().replace('path = "case.duckdb"', 'memory_limit = "lots"'))
    with pytest.raises(ManifestError) as err:
        load_case(case)
    assert str(err.value) == (
        "case.toml: [database].memory_limit: not a memory size such as '1GB' or '512MB': 'lots'"
    )


def test_os_umask_is_left_alone_by_the_library():
    mask = os.umask(0o022)
    try:
        connect(":memory:").close()
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(mask)
