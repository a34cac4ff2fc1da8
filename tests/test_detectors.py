"""Every detector in queries/: its metadata contract and its own true/false-positive cases."""

from __future__ import annotations

import re

import pytest

from forensics.db import connect, insert_rows
from forensics.detect import prepare, run_detector
from forensics.detectors import SIGNAL_COLUMNS, load_detectors

DETECTORS = load_detectors()
CASES = [(d, t) for d in DETECTORS for t in d.tests]


def test_every_sql_has_metadata_and_the_reverse():
    from forensics.paths import queries_dir

    sql = {p.stem for p in queries_dir().glob("*.sql")}
    yml = {p.stem for p in queries_dir().glob("*.yml")}
    assert sql == yml
    assert {d.id for d in DETECTORS} == sql  # the id is the file name
    assert len(DETECTORS) == len({d.id for d in DETECTORS})


@pytest.mark.parametrize("det", DETECTORS, ids=lambda d: d.id)
def test_metadata_is_complete(det):
    assert re.fullmatch(r"[a-z0-9_]+", det.id)
    assert det.title and det.description
    assert det.severity in {"critical", "high", "medium", "low"}
    assert det.output_columns == SIGNAL_COLUMNS
    expects = [bool(t["expect"]) for t in det.tests]
    assert True in expects and False in expects, "needs a true-positive and a true-negative case"
    # Every $parameter the SQL uses is declared (and so appears in the report's description),
    # as DuckDB's parser names them.
    import duckdb

    used = set().union(
        *(st.named_parameters for st in duckdb.connect().extract_statements(det.sql))
    )
    assert used == set(det.parameters), f"SQL uses {used}, metadata declares {set(det.parameters)}"


@pytest.mark.parametrize("det", DETECTORS, ids=lambda d: d.id)
def test_binds_on_the_empty_schema_and_declares_its_columns(det):
    con = connect(":memory:")
    prepare(con, {"context_length": None})
    result = run_detector(con, det, det.defaults())
    assert result.num_rows == 0
    assert result.column_names == det.output_columns


@pytest.mark.parametrize("det", DETECTORS, ids=lambda d: d.id)
def test_description_is_rendered_from_the_parameters(det):
    text = det.describe(det.defaults())
    assert "{" not in text and "}" not in text.replace("\\d+", "")
    changed = {
        k: (12345 if isinstance(v, int | float) and not isinstance(v, bool) else v)
        for k, v in det.defaults().items()
    }
    if changed != det.defaults():
        assert det.describe(changed) != text


@pytest.mark.parametrize("det,case", CASES, ids=[f"{d.id}: {t['name']}" for d, t in CASES])
def test_detector_case(det, case):
    con = connect(":memory:")
    for kind, rows in case.get("rows", {}).items():
        insert_rows(con, kind, rows)
    params = det.defaults() | (case.get("params") or {})
    prepare(con, {"context_length": params.get("context_length")})
    result = run_detector(con, det, params)
    assert sorted(result.column("request_id").to_pylist()) == sorted(case["expect"])
    for evidence in result.column("evidence").to_pylist():
        assert '"table"' in evidence and '"source_row"' in evidence
