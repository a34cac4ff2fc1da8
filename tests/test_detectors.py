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


def test_a_prompt_no_record_places_is_likely_over_every_limit_and_reviewed_between(tmp_path):
    """Engine records alone, the prefill log lost: the decode legs' reservations are judged
    against the prefill limits in force. Over every node's limit it was refused wherever it
    went (likely, notified); over only the smaller pool's it may have been served whole on
    the larger (possible, reviewed): never a notice on a guess of the node."""
    from forensics.case import load_case
    from forensics.detect import detect_case

    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "INC-U"\ncontext_length = 1048576\n')
    case = load_case(manifest)
    con = connect(case.database)
    snap = {"observed_at": "2026-08-27T00:00:00Z", "context_length": 1048576}
    insert_rows(
        con,
        "pool_snapshots",
        [
            {**snap, "node": "p0", "role": "prefill", "max_total_num_tokens": 681280},
            {**snap, "node": "p1", "role": "prefill", "max_total_num_tokens": 917504},
            {**snap, "node": "d0", "role": "decode", "max_total_num_tokens": 2000000},
        ],
    )

    def decode(rid, reserved, minute):
        return {
            "request_id": rid,
            "role": "decode",
            "node": "d0",
            "dp_rank": 0,
            "started_at": f"2026-08-28T10:{minute:02d}:00Z",
            "finished_at": f"2026-08-28T10:{minute:02d}:09Z",
            "reserved_tokens": reserved,
            "finish_type": "stop",
        }

    insert_rows(
        con,
        "engine_legs",
        [decode("over-all", 950000, 1), decode("between", 800000, 2), decode("under", 600000, 3)],
    )
    detect_case(con, case)
    assert con.execute(
        "SELECT request_id, verdict, signals FROM findings_affected ORDER BY request_id"
    ).fetchall() == [
        ("between", "possible", "over_pool_unplaced"),
        ("over-all", "likely", "over_pool"),
    ]
