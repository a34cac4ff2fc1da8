"""Client and engine logs that do not name the same requests: the check that says so.

A gateway that logs its own request ids (not the engine's rid) and no bootstrap room leaves
every response on both sides unmatched: each is judged twice and the engine side names no
tenant. The check must say so, and stay silent where the logs share their ids but one side lost
some of its records.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from forensics.basis import evidence_basis
from forensics.case import load_case
from forensics.db import connect
from forensics.detect import detect_case
from forensics.ingest import ingest_case
from forensics.simulate import simulate_case


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keying") / "case"
    simulate_case(folder, requests=2_000, seed=23)
    return folder


def _variant(simulated: Path, tmp_path: Path, rewrite: str | None = None) -> Path:
    """A copy of the simulated case, each client file's rows passed through ``rewrite`` (a
    SELECT list over the file's columns)."""
    folder = tmp_path / "case"
    shutil.copytree(simulated, folder, ignore=shutil.ignore_patterns("case.duckdb*"))
    if rewrite:
        con = duckdb.connect()
        for path in sorted((folder / "evidence").glob("requests-*.jsonl.gz")):
            out = path.with_suffix(".tmp")
            con.execute(
                f"COPY (SELECT {rewrite} FROM read_json('{path}')) TO '{out}'"
                " (FORMAT json, COMPRESSION gzip)"
            )
            out.replace(path)
    return folder


def _keying(folder: Path) -> tuple[list[str], duckdb.DuckDBPyConnection]:
    case = load_case(folder / "case.toml")
    ingest_case(case)
    con = connect(case.database)
    summary = detect_case(con, case)
    warned = [
        w
        for w, c in zip(summary.warnings, summary.warning_codes, strict=True)
        if c == "logs_keyed_apart"
    ]
    return warned, con


GATEWAY_IDS = "* REPLACE ('gw-' || request_id AS request_id, NULL AS bootstrap_room)"


def test_logs_that_share_their_ids_are_not_warned(simulated, tmp_path):
    warned, _ = _keying(_variant(simulated, tmp_path))
    assert warned == []


def test_a_client_log_missing_days_is_not_logs_keyed_apart(simulated, tmp_path):
    folder = _variant(simulated, tmp_path)
    days = sorted((folder / "evidence").glob("requests-*.jsonl.gz"))
    for path in days[3:8]:  # the engine logs keep those days: engine requests, no client record
        path.unlink()
    warned, con = _keying(folder)
    assert warned == []
    assert con.execute("SELECT count(*) FROM engine_requests").fetchone()[0] > 300


def test_a_gateway_that_logs_its_own_ids_is_warned_with_its_twins(simulated, tmp_path):
    warned, con = _keying(_variant(simulated, tmp_path, GATEWAY_IDS))
    assert len(warned) == 1
    text = warned[0]
    assert text.startswith("The client log and the engine logs name the same requests by")
    assert "prompt tokens with no engine leg have an engine request with no client record" in text
    assert "counted twice among the affected" in text
    assert "recipient and source counts are floors, not an all-clear" in text
    # The alert comes first among the warnings: it explains the ones after it.
    first = con.execute("SELECT code FROM findings_warnings LIMIT 1").fetchone()[0]
    assert first == "logs_keyed_apart"
    # Every source read is an engine request with no tenant: the source figure says so.
    basis = evidence_basis(con)
    assert "their tenants are unknown, so this count is a floor" in basis.caveats["sources"]


def test_only_some_gateway_ids_apart_is_still_warned(simulated, tmp_path):
    some = (
        "* REPLACE (CASE WHEN hash(request_id) % 4 = 0 THEN 'gw-' || request_id"
        " ELSE request_id END AS request_id, CASE WHEN hash(request_id) % 4 = 0 THEN NULL"
        " ELSE bootstrap_room END AS bootstrap_room)"
    )
    warned, _ = _keying(_variant(simulated, tmp_path, some))
    assert len(warned) == 1 and "by different ids" in warned[0]


def test_engine_logs_of_other_traffic_share_few_requests(simulated, tmp_path):
    folder = _variant(simulated, tmp_path)
    other = tmp_path / "other"
    simulate_case(other, requests=2_000, seed=24)
    for path in (other / "evidence").glob("engine_legs-*"):
        shutil.copy(path, folder / "evidence" / path.name)
    warned, _ = _keying(folder)
    assert len(warned) == 1
    assert warned[0].startswith("The client log and the engine logs share few requests")
    assert "If they are of other traffic (another fleet or model)" in warned[0]
