"""Canonical JSON Lines files read by DuckDB's JSON reader load exactly what the line reader
loads, and every file that reader would read otherwise goes to the line reader."""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path

import duckdb
import pytest

from forensics import schema
from forensics.db import connect
from forensics.ingest import ingest_file, ingest_paths
from forensics.readers import count_lines, json_lines_natively

KNOWN = {c.name for c in schema.columns("requests")}


def _request(day: int, i: int, **changes) -> dict:
    return {
        "request_id": f"d{day}-{i}",
        "tenant_id": f"acct_{i % 3}",
        "received_at": f"2026-09-0{day}T10:{i:02d}:00.123456Z",
        "prompt_tokens": 1000 * (i + 1),
        "http_status": 200,
        **changes,
    }


def _lines(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def _varied(day: int) -> list[dict]:
    """Values in every form JSON gives them: floats written many ways, a 63-bit integer, a
    boolean, a nested object, escapes, explicit nulls and keys some rows lack."""
    rows = [_request(day, i) for i in range(6)]
    rows[0].update(ttft_ms=1e3, e2e_ms=1.50, bootstrap_room=8391886446041432568)
    rows[1].update(ttft_ms=-0.0, completion_tokens=None, user_agent='sdk \u00e9\n"q"')
    rows[2].update(model={"name": "glm", "v": [1, 2]}, client_ip="10.0.0.1")
    rows[3].update(finish_reason=True, cached_tokens=0)
    rows[4].update(received_at=f"2026-09-0{day} 12:00:00+02:00", e2e_ms=1.0e2)
    return rows


def _tables(db: Path) -> dict[str, list[tuple]]:
    con = connect(db)
    try:
        return {
            table: con.execute(
                f"SELECT * EXCLUDE (evidence_id), evidence_id - (SELECT min(evidence_id) "
                f"FROM evidence) FROM {table} ORDER BY ALL"
            ).fetchall()
            for table in ("requests", "rejects")
        } | {
            "evidence": con.execute(
                "SELECT * EXCLUDE (evidence_id, loaded_at) FROM evidence ORDER BY evidence_id"
            ).fetchall()
        }
    finally:
        con.close()


def _line_by_line(db: Path, files: list[Path]) -> dict[str, list[tuple]]:
    con = connect(db)
    for path in files:
        ingest_file(con, path, "requests")
    con.close()
    return _tables(db)


def test_clean_files_load_by_duckdbs_reader_exactly_as_line_by_line(tmp_path, batches):
    files = [
        _write(tmp_path / "r-1.jsonl.gz", _lines(_varied(1))),
        _write(tmp_path / "r-2.jsonl.gz", _lines(_varied(2)).replace(b"\n", b"\r\n")),
        # A byte-order mark, and no newline after the last line.
        _write(tmp_path / "r-3.jsonl.gz", b"\xef\xbb\xbf" + _lines(_varied(3))[:-1]),
    ]
    together = ingest_paths(tmp_path / "together.duckdb", files, "requests")
    assert batches == [3]
    assert [f.rows_loaded for f in together.files] == [6, 6, 6]
    assert _tables(tmp_path / "together.duckdb") == _line_by_line(tmp_path / "alone.duckdb", files)
    con = connect(tmp_path / "together.duckdb")
    assert con.execute(
        "SELECT source_row, bootstrap_room, ttft_ms, model FROM requests "
        "WHERE request_id IN ('d1-0', 'd1-2') ORDER BY 1"
    ).fetchall() == [
        (1, "8391886446041432568", 1000.0, None),
        (3, None, None, '{"name":"glm","v":[1,2]}'),
    ]


def test_one_plain_file_loads_by_duckdbs_reader_too(tmp_path, batches):
    path = _write(tmp_path / "r.jsonl", _lines(_varied(1)))
    result = ingest_paths(tmp_path / "case.duckdb", [path], "requests")
    assert batches == [1]
    assert result.rows_loaded == 6
    assert _tables(tmp_path / "case.duckdb") == _line_by_line(tmp_path / "alone.duckdb", [path])


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("blank line", _lines([_request(1, 0)]) + b"\n  \r\n" + _lines([_request(1, 1)])),
        ("empty line", _lines([_request(1, 0)]) + b"\n" + _lines([_request(1, 1)])),
        ("empty last line", _lines([_request(1, 0)]) + b"\n"),
        ("not JSON", _lines([_request(1, 0)]) + b'{"request_id": \n'),
        ("not an object", _lines([_request(1, 0)]) + b"null\n[1, 2]\n"),
        ("an empty object", _lines([_request(1, 0)]) + b"{}\n"),
        ("repeated key", b'{"request_id": "a", "request_id": "b"}\n' + _lines([_request(1, 1)])),
        ("unknown key", _lines([_request(1, 0, region="eu")])),
        ("keys differing in case", _lines([_request(1, 0, Tenant_ID="x")])),
        ("a value that does not cast", _lines([_request(1, 0, prompt_tokens="many")])),
        ("invalid UTF-8", _lines([_request(1, 0, user_agent="caf")]).replace(b"caf", b"caf\xff")),
    ],
)
def test_files_duckdbs_reader_would_misread_go_line_by_line(tmp_path, batches, name, data):
    files = [
        _write(tmp_path / "clean.jsonl.gz", _lines(_varied(2))),
        _write(tmp_path / "odd.jsonl.gz", data),
    ]
    result = ingest_paths(tmp_path / "case.duckdb", files, "requests")
    # The batch is undone (no file loads half one way and half the other); the clean file
    # loads by DuckDB's reader again, the odd one line by line.
    assert batches == [-2, 1], name
    assert not result.failures
    assert _tables(tmp_path / "case.duckdb") == _line_by_line(tmp_path / "alone.duckdb", files)


def test_a_carriage_return_inside_an_object_still_loads_by_duckdbs_reader(tmp_path, batches):
    # JSON allows a carriage return between tokens; the one-pass line count refuses it, and
    # the file is counted the slower way instead, not sent line by line.
    data = _lines(_varied(1)).replace(b', "tenant_id"', b',\r "tenant_id"')
    assert data.count(b"\r") == 6
    path = _write(tmp_path / "r.jsonl.gz", data)
    result = ingest_paths(tmp_path / "case.duckdb", [path], "requests")
    assert batches == [1]
    assert result.rows_loaded == 6
    assert _tables(tmp_path / "case.duckdb") == _line_by_line(tmp_path / "alone.duckdb", [path])


def test_a_reject_keeps_its_raw_line_and_line_number(tmp_path, batches):
    rows = [_request(1, i) for i in range(3)]
    rows[1]["prompt_tokens"] = -5
    path = _write(tmp_path / "r.jsonl", b"\n" + _lines(rows))
    result = ingest_paths(tmp_path / "case.duckdb", [path], "requests")
    assert batches == [-1]
    assert (result.rows_loaded, result.rows_rejected) == (2, 1)
    con = connect(tmp_path / "case.duckdb")
    assert con.execute("SELECT source_row, column_name, raw FROM rejects").fetchall() == [
        (3, "prompt_tokens", json.dumps(rows[1]))
    ]


def test_a_repeat_of_a_loaded_row_is_rejected_as_line_by_line(tmp_path, batches):
    first = _write(tmp_path / "a.jsonl", _lines([_request(1, i) for i in range(3)]))
    again = _write(tmp_path / "b.jsonl", _lines([_request(1, 2), _request(1, 9)]))
    result = ingest_paths(tmp_path / "case.duckdb", [first, again], "requests")
    assert batches == [-2, 1]
    assert [f.duplicates for f in result.files] == [0, 1]
    assert _tables(tmp_path / "case.duckdb") == _line_by_line(
        tmp_path / "alone.duckdb", [first, again]
    )


def test_files_of_different_keys_go_line_by_line(tmp_path, batches):
    # A missing column takes the entry's default in one file but not in the other: read
    # together they would share one column set.
    files = [
        _write(tmp_path / "a.jsonl", _lines([_request(1, 0)])),
        _write(tmp_path / "b.jsonl", _lines([_request(1, 1, model="m")])),
    ]
    ingest_paths(tmp_path / "case.duckdb", files, "requests")
    assert batches == [-2, 1]
    assert _tables(tmp_path / "case.duckdb") == _line_by_line(tmp_path / "alone.duckdb", files)


def test_the_reader_is_declined_when_insertion_order_is_not_kept(tmp_path):
    path = _write(tmp_path / "r.jsonl", _lines([_request(1, 0)]))
    con = duckdb.connect()
    assert json_lines_natively(con, [path], None, KNOWN).declined == []
    con.execute("SET preserve_insertion_order = false")
    assert json_lines_natively(con, [path], None, KNOWN).declined == [0]


def test_line_numbers_follow_each_file_in_a_large_batch(tmp_path):
    # Large enough for DuckDB to read in parallel blocks: each row's line must still be its
    # own line in its own file.
    files = []
    for f in range(3):
        rows = [
            _request(1, 0, request_id=f"{f}-{i}", user_agent="x" * (i % 300)) for i in range(40_000)
        ]
        files.append(_write(tmp_path / f"r-{f}.jsonl", _lines(rows)))
    con = duckdb.connect()
    con.execute("SET threads = 4")
    native = json_lines_natively(con, files, None, KNOWN)
    con.execute(f"CREATE TEMP TABLE staged AS {native.read}")
    relation = native.numbered("staged")
    wrong = con.execute(
        f"SELECT count(*) FROM {relation} "
        "WHERE request_id <> (__kv_file_no - 1)::VARCHAR || '-' || (__kv_row - 1)::VARCHAR"
    ).fetchone()
    assert wrong == (0,)


def test_count_lines_counts_blank_lines_and_an_unterminated_last_one(tmp_path):
    assert count_lines(_write(tmp_path / "a.jsonl", b"x\n\n y\n"), None) == 3
    assert count_lines(_write(tmp_path / "b.jsonl.gz", b"x\ny"), "gzip") == 2
    assert count_lines(_write(tmp_path / "c.jsonl", b""), None) == 0
    cut = tmp_path / "d.jsonl.gz"
    cut.write_bytes(gzip.compress(b"x\n" * 1000)[:-12])
    assert count_lines(cut, "gzip") is None


def test_a_file_whose_name_is_a_pattern_goes_line_by_line(tmp_path, batches):
    _write(tmp_path / "r1.jsonl", _lines([_request(9, 0)]))
    named = _write(tmp_path / "r[1].jsonl", _lines([_request(1, 0)]))
    result = ingest_paths(tmp_path / "case.duckdb", [Path(glob.escape(str(named)))], "requests")
    assert batches == []
    assert result.rows_loaded == 1
    con = connect(tmp_path / "case.duckdb")
    assert con.execute("SELECT request_id FROM requests").fetchall() == [("d1-0",)]
