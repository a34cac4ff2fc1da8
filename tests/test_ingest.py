"""Canonical ingest: formats, compression, timestamps, rejects, failures, idempotence."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from fixtures.damaged import ALLOC_CSV, damaged_tiny_case, gzip_cut, zstd_cut

from forensics.case import load_case
from forensics.db import connect
from forensics.errors import EvidenceError, ForensicsError
from forensics.ingest import (
    evidence_outcomes,
    evidence_status,
    ingest_case,
    ingest_file,
    ingest_paths,
)
from forensics.schema import columns

BIG = [9223372036854775807, 1234567890123456789]
FIXTURES = Path(__file__).parent / "fixtures"


def _rows() -> list[dict]:
    """Canonical requests with every column type, including 63-bit bootstrap rooms."""
    rows = []
    for i in range(6):
        rows.append(
            {
                "request_id": f"req-{i}",
                "tenant_id": f"acct_{i % 3}",
                "received_at": f"2026-09-08T14:0{i}:00.250000Z",
                "prompt_tokens": 681274 + i * 1000,
                "http_status": 200 if i != 4 else 400,
                "completion_tokens": 10 + i,
                "ttft_ms": 12.5 * i,
                "finish_reason": "stop",
                "decode_node": "decode-0",
                "dp_rank": i % 2,
                "bootstrap_room": BIG[i % 2],
                "user_agent": 'sdk "quoted", with comma',
            }
        )
    return rows


def _compress(data: bytes, compression: str | None) -> bytes:
    if compression == "gz":
        return gzip.compress(data)
    if compression == "zst":
        return zstandard.ZstdCompressor().compress(data)
    return data


def write(path: Path, rows: list[dict], compression: str | None = None) -> Path:
    """Write rows as JSONL, CSV or Parquet (by path suffix), optionally compressed."""
    fmt = path.suffix.lstrip(".")
    if compression:
        path = path.with_name(path.name + "." + compression)
    if fmt == "jsonl":
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    elif fmt == "csv":
        names = list(dict.fromkeys(k for r in rows for k in r))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        data = buf.getvalue().encode()
    else:
        table = pa.Table.from_pylist(rows)
        if "received_at" in table.column_names and pa.types.is_string(table["received_at"].type):
            stamps = [
                datetime.fromisoformat(v.replace("Z", "+00:00"))
                for v in table["received_at"].to_pylist()
            ]
            i = table.column_names.index("received_at")
            table = table.set_column(i, "received_at", pa.array(stamps, pa.timestamp("us", "UTC")))
        sink = io.BytesIO()
        pq.write_table(table, sink)
        data = sink.getvalue()
    path.write_bytes(_compress(data, compression))
    return path


def table_contents(con, kind: str = "requests") -> list[tuple]:
    names = ", ".join(f'"{c.name}"' for c in columns(kind))
    return con.execute(f"SELECT {names}, extra FROM {kind} ORDER BY ALL").fetchall()


def rejects(con) -> list[tuple]:
    return con.execute(
        "SELECT source_row, column_name, reason FROM rejects ORDER BY evidence_id, source_row"
    ).fetchall()


# --- formats and compression ---------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "gz", "zst"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_every_format_and_compression_loads_the_same_rows(tmp_path, memory_db, fmt, compression):
    path = write(tmp_path / f"requests.{fmt}", _rows(), compression)
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (6, 6, 0)
    assert not result.skipped
    got = memory_db.execute(
        "SELECT request_id, received_at, prompt_tokens, bootstrap_room, ttft_ms, user_agent, "
        "source_row FROM requests ORDER BY source_row"
    ).fetchall()
    assert got[1] == (
        "req-1",
        datetime(2026, 9, 8, 14, 1, 0, 250000, tzinfo=UTC),
        682274,
        "1234567890123456789",
        12.5,
        'sdk "quoted", with comma',
        2,
    )
    assert [r[-1] for r in got] == [1, 2, 3, 4, 5, 6]


def test_jsonl_csv_and_parquet_give_identical_tables(tmp_path):
    contents = []
    for fmt in ("jsonl", "csv", "parquet"):
        con = connect(":memory:")
        ingest_file(con, write(tmp_path / f"r.{fmt}", _rows()), "requests")
        contents.append(table_contents(con))
    assert contents[0] == contents[1] == contents[2]
    assert len(contents[0]) == 6


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_63_bit_bootstrap_room_is_stored_exactly(tmp_path, memory_db, fmt):
    rows = [dict(_rows()[0], request_id=f"r{i}", bootstrap_room=b) for i, b in enumerate(BIG)]
    ingest_file(memory_db, write(tmp_path / f"r.{fmt}", rows), "requests")
    got = memory_db.execute("SELECT bootstrap_room FROM requests ORDER BY request_id").fetchall()
    assert got == [("9223372036854775807",), ("1234567890123456789",)]


def test_a_late_odd_row_does_not_change_a_column_type(tmp_path, memory_db):
    rows = [dict(_rows()[0], request_id=f"r{i}", bootstrap_room=i) for i in range(3000)]
    rows.append(dict(rows[0], request_id="late", bootstrap_room="room-abc", prompt_tokens="12x"))
    rows.append(dict(rows[0], request_id="late2", bootstrap_room="room-def"))
    result = ingest_file(memory_db, write(tmp_path / "r.jsonl", rows), "requests")
    assert (result.rows_loaded, result.rows_rejected) == (3001, 1)
    assert rejects(memory_db) == [(3001, "prompt_tokens", "not an integer: '12x'")]
    room = memory_db.execute("SELECT bootstrap_room FROM requests WHERE request_id='late2'")
    assert room.fetchone() == ("room-def",)


# --- timestamps ----------------------------------------------------------------------------

EXPECTED = datetime(2026, 9, 8, 14, 2, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2026-09-08T14:02:03Z", EXPECTED),
        ("2026-09-08T14:02:03.5z", EXPECTED.replace(microsecond=500000)),
        ("2026-09-08T16:02:03+02:00", EXPECTED),
        ("2026-09-08 09:02:03-0500", EXPECTED),
        # naive: in the manifest time zone (Europe/Rome is UTC+2 in September)
        ("2026-09-08 16:02:03", EXPECTED),
        ("2026-09-08T16:02:03.000001", EXPECTED.replace(microsecond=1)),
        (1788876123, EXPECTED),  # epoch seconds
        (1788876123.25, EXPECTED.replace(microsecond=250000)),
        (1788876123000, EXPECTED),  # milliseconds
        (1788876123000123, EXPECTED.replace(microsecond=123)),  # microseconds
        (1788876123000123456, EXPECTED.replace(microsecond=123)),  # nanoseconds
        ("1788876123", EXPECTED),  # numeric strings
        ("1788876123000", EXPECTED),
        ("1788876123.5", EXPECTED.replace(microsecond=500000)),
        ("1788876123.233002", EXPECTED.replace(microsecond=233002)),  # as engines log it
        ("1788876123.0000019", EXPECTED.replace(microsecond=1)),  # beyond us: floored
        (" 1788876123000123 ", EXPECTED.replace(microsecond=123)),
    ],
)
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_timestamp_forms(tmp_path, memory_db, fmt, value, expected):
    row = dict(_rows()[0], received_at=value)
    ingest_file(memory_db, write(tmp_path / f"r.{fmt}", [row]), "requests", timezone="Europe/Rome")
    assert rejects(memory_db) == []
    assert memory_db.execute("SELECT received_at FROM requests").fetchone()[0] == expected


def test_parquet_timestamp_types(tmp_path, memory_db):
    naive = datetime(2026, 9, 8, 16, 2, 3)  # Europe/Rome wall clock
    table = pa.table(
        {
            "request_id": ["a", "b", "c", "d"],
            "tenant_id": ["t"] * 4,
            "prompt_tokens": pa.array([1, 2, 3, 4], pa.int32()),
            "http_status": [200] * 4,
            "received_at": pa.array([naive] * 4, pa.timestamp("ns")),
            "first_token_at": pa.array([EXPECTED] * 4, pa.timestamp("ms", "UTC")),
            "completed_at": pa.array(
                [1788876123, 1788876123000, 1788876123000000, 1788876123000000000], pa.int64()
            ),
            "ttft_ms": pa.array([1.5, 2, 3, 4], pa.float32()),
            "dp_rank": pa.array([1.0, 2.0, 3.0, 4.0], pa.float64()),
        }
    )
    pq.write_table(table, tmp_path / "r.parquet")
    ingest_file(memory_db, tmp_path / "r.parquet", "requests", timezone="Europe/Rome")
    got = memory_db.execute(
        "SELECT DISTINCT received_at, first_token_at, completed_at FROM requests"
    ).fetchall()
    assert got == [(EXPECTED, EXPECTED, EXPECTED)]
    assert memory_db.execute("SELECT sum(dp_rank) FROM requests").fetchone() == (10,)


# --- bad rows ------------------------------------------------------------------------------

BAD_JSONL = """\
{"request_id":"ok-1","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":5,"http_status":200}
{"request_id":"r2","tenant_id":"a","received_at":"yesterday","prompt_tokens":5,"http_status":200}

{"request_id":"r4","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":"12x","http_status":200}
{"request_id":"r5","tenant_id":"","received_at":"2026-09-08T14:00:00Z","prompt_tokens":5,"http_status":200}
{"request_id":"r6","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":5.5,"http_status":200}
{"request_id":"r7","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":5}
{"request_id": "r8", truncated
[1, 2, 3]
{"request_id":"r10","request_id":"r10b","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":5,"http_status":200}
{"request_id":"r11","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":5,"http_status":200,"ttft_ms":"fast"}
{"request_id":"ok-12","tenant_id":"a","received_at":"2026-09-08T14:00:00Z","prompt_tokens":"7.0","http_status":"200"}
"""


def test_bad_rows_are_counted_and_quarantined_with_reasons(tmp_path, memory_db):
    path = tmp_path / "bad.jsonl"
    path.write_text(BAD_JSONL)
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (11, 2, 9)
    assert rejects(memory_db) == [
        (2, "received_at", "not a timestamp: 'yesterday'"),
        (4, "prompt_tokens", "not an integer: '12x'"),
        (5, "tenant_id", "required value missing"),
        (6, "prompt_tokens", "not an integer: '5.5'"),
        (7, "http_status", "required value missing"),
        (8, None, "not valid JSON"),
        (9, None, "not a JSON object"),
        (10, None, "duplicate key in JSON object"),
        (11, "ttft_ms", "not a number: 'fast'"),
    ]
    raw = memory_db.execute("SELECT raw FROM rejects WHERE source_row = 8").fetchone()[0]
    assert raw == '{"request_id": "r8", truncated'
    loaded = memory_db.execute(
        "SELECT request_id, prompt_tokens, http_status, source_row "
        "FROM requests ORDER BY source_row"
    ).fetchall()
    assert loaded == [("ok-1", 5, 200, 1), ("ok-12", 7, 200, 12)]
    ev = memory_db.execute("SELECT rows_read, rows_loaded, rows_rejected FROM evidence").fetchone()
    assert ev == (11, 2, 9)


def test_csv_bad_rows_keep_their_data_row_numbers(tmp_path, memory_db):
    path = tmp_path / "bad.csv"
    path.write_text(
        "request_id,tenant_id,received_at,prompt_tokens,http_status,user_agent\n"
        "a,t,2026-09-08T14:00:00Z,5,200,x\n"
        'b,t,2026-09-08T14:00:00Z,5,200,"multi\nline"\n'
        "c,t,2026-09-08T14:00:00Z,5,200,x,surplus\n"
        "\n"
        "d,t,2026-09-08T14:00:00Z,5x,200,x\n"
        "e,t,2026-09-08T14:00:00Z,5\n"
        "f,t,2026-09-08T14:00:00Z,5,200,\n"
    )
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (6, 3, 3)
    assert rejects(memory_db) == [
        (3, None, "malformed CSV row: expected 6 fields, found 7"),
        (4, "prompt_tokens", "not an integer: '5x'"),
        (5, None, "malformed CSV row: expected 6 fields, found 4"),
    ]
    got = memory_db.execute("SELECT request_id, source_row, user_agent FROM requests ORDER BY 2")
    assert got.fetchall() == [("a", 1, "x"), ("b", 2, "multi\nline"), ("f", 6, None)]
    raw = memory_db.execute("SELECT raw FROM rejects WHERE source_row = 4").fetchone()[0]
    assert raw == "d,t,2026-09-08T14:00:00Z,5x,200,x"


def test_parquet_bad_values_are_rejected_with_the_row_as_json(tmp_path, memory_db):
    table = pa.table(
        {
            "request_id": ["a", "b", None],
            "tenant_id": ["t", "t", "t"],
            "received_at": ["2026-09-08T14:00:00Z", "soon", "2026-09-08T14:00:00Z"],
            "prompt_tokens": [1, 2, 3],
            "http_status": [200, 200, 200],
        }
    )
    pq.write_table(table, tmp_path / "r.parquet")
    result = ingest_file(memory_db, tmp_path / "r.parquet", "requests")
    assert (result.rows_loaded, result.rows_rejected) == (1, 2)
    assert rejects(memory_db) == [
        (2, "received_at", "not a timestamp: 'soon'"),
        (3, "request_id", "required value missing"),
    ]
    raw = memory_db.execute("SELECT raw FROM rejects WHERE source_row = 2").fetchone()[0]
    assert json.loads(raw)["received_at"] == "soon"


# --- columns -------------------------------------------------------------------------------


def test_unknown_columns_are_kept_in_extra(tmp_path, memory_db):
    rows = [dict(_rows()[0], region="eu-west", trace={"id": 7}), dict(_rows()[1], region=None)]
    ingest_file(memory_db, write(tmp_path / "r.jsonl", rows), "requests")
    got = memory_db.execute("SELECT request_id, extra FROM requests ORDER BY 1").fetchall()
    assert json.loads(got[0][1]) == {"region": "eu-west", "trace": {"id": 7}}
    assert got[1][1] is None


def test_missing_required_column_fails_the_file_naming_it(tmp_path, memory_db):
    rows = [{k: v for k, v in r.items() if k != "tenant_id"} for r in _rows()]
    path = write(tmp_path / "r.csv", rows)
    with pytest.raises(EvidenceError, match=r"r\.csv: missing required column 'tenant_id'"):
        ingest_file(memory_db, path, "requests")
    assert memory_db.execute("SELECT count(*) FROM evidence").fetchone() == (0,)


def test_defaults_supply_a_column_the_file_lacks(tmp_path, memory_db):
    path = tmp_path / "info.jsonl"
    path.write_text('{"max_total_num_tokens": 681280, "page_size": 1}\n')
    when = datetime(2026, 9, 8, 12, tzinfo=UTC)
    result = ingest_file(
        memory_db,
        path,
        "pool_snapshots",
        defaults={"node": "prefill-0", "role": "prefill", "observed_at": when},
    )
    assert result.first_at == when
    got = memory_db.execute(
        "SELECT node, role, observed_at, max_total_num_tokens FROM pool_snapshots"
    ).fetchall()
    assert got == [("prefill-0", "prefill", when, 681280)]


# --- whole-file failures -------------------------------------------------------------------


def test_corrupt_files_fail_alone_while_the_others_load(tmp_path):
    good = write(tmp_path / "good.jsonl", _rows())
    # Other requests than good.jsonl's: the same ones would be rejected as duplicates.
    other = [dict(r, request_id=f"cut-{r['request_id']}") for r in _rows()]
    truncated = write(tmp_path / "cut.jsonl", other, "gz")
    truncated.write_bytes(truncated.read_bytes()[:-20])
    (tmp_path / "garbage.jsonl").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "notes.txt").write_text("hello")
    result = ingest_paths(
        tmp_path / "case.duckdb",
        [
            good,
            truncated,
            tmp_path / "garbage.jsonl",
            tmp_path / "garbage.parquet",
            tmp_path / "notes.txt",
            tmp_path / "absent.csv",
        ],
        "requests",
    )
    # The truncated file keeps the five lines before its damage (it used to fail whole).
    assert [f.path for f in result.files] == [str(good), str(truncated)]
    assert [f.outcome for f in result.files] == ["loaded", "partial"]
    assert result.rows_loaded == 6 + 5
    messages = dict((f.path.rsplit("/", 1)[-1], f.message) for f in result.failures)
    assert "cut.jsonl.gz" not in messages
    assert messages["garbage.jsonl"].startswith("not JSON Lines")
    assert messages["garbage.parquet"].startswith("not a readable Parquet file")
    assert messages["notes.txt"].startswith("unknown file type")
    assert messages["absent.csv"] == "file not found"
    assert all(e.startswith(str(tmp_path)) and "\n" not in e for e in result.errors)
    con = connect(tmp_path / "case.duckdb")
    assert con.execute("SELECT count(*), sum(rows_loaded) FROM evidence").fetchone() == (2, 11)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (11,)


def test_unsupported_format_and_kind_are_clear_errors(tmp_path, memory_db):
    path = write(tmp_path / "r.jsonl", _rows())
    with pytest.raises(EvidenceError, match="format 'helicone' is not supported yet"):
        ingest_file(memory_db, path, "requests", "helicone")
    with pytest.raises(EvidenceError, match="format 'sglang' maps onto engine_legs, pool_"):
        ingest_file(memory_db, path, "requests", "sglang")
    with pytest.raises(ForensicsError, match="unknown evidence kind 'request'"):
        ingest_file(memory_db, path, "request")
    assert ingest_file(memory_db, path, "requests", "auto").format == "canonical"


# --- idempotence and the case --------------------------------------------------------------


def test_reingesting_the_same_file_is_a_noop(tmp_path, memory_db):
    path = write(tmp_path / "r.csv", _rows())
    first = ingest_file(memory_db, path, "requests")
    copy = tmp_path / "copy.csv"
    copy.write_bytes(path.read_bytes())
    again = ingest_file(memory_db, copy, "requests")
    assert again.skipped and again.evidence_id == first.evidence_id
    assert again.rows_loaded == first.rows_loaded == 6
    assert memory_db.execute("SELECT count(*) FROM requests").fetchone() == (6,)
    assert memory_db.execute("SELECT count(*) FROM evidence").fetchone() == (1,)
    with pytest.raises(EvidenceError, match="already loaded as kind requests"):
        ingest_file(memory_db, path, "engine_legs")


def test_ingest_case_loads_the_tiny_case_once(tiny_case_dir):
    case = load_case(tiny_case_dir / "case.toml")
    result = ingest_case(case)
    assert result.ok and result.errors == []
    assert {f.path: f.rows_loaded for f in result.files} == {
        "requests.jsonl": 31,
        "engine_legs.jsonl": 60,
        "pool_snapshots.csv": 3,
        "tenants.csv": 5,
    }
    again = ingest_case(case)
    assert all(f.skipped for f in again.files) and again.rows_loaded == 0
    con = connect(case.database)
    over = con.execute(
        "SELECT request_id FROM requests WHERE prompt_tokens >= 681274 AND http_status = 200 "
        "ORDER BY 1"
    ).fetchall()
    assert [r[0] for r in over] == ["req-101", "req-102", "req-103", "req-104"]
    assert con.execute("SELECT extra FROM tenants WHERE tenant_id = 'acct_alpha'").fetchone() == (
        '{"tier":"enterprise"}',
    )
    status = evidence_status(con)
    assert status.rows_loaded == 99 and status.rows_rejected == 0
    spans = {s.kind: (s.rows, s.first_at) for s in status.spans}
    assert spans["requests"] == (31, datetime(2026, 9, 8, 10, tzinfo=UTC))


def test_ingest_case_records_a_glob_that_matches_nothing(tiny_case_dir):
    manifest = tiny_case_dir / "case.toml"
    manifest.write_text(manifest.read_text().replace('"requests.jsonl"', '"requests-*.jsonl"'))
    result = ingest_case(load_case(manifest))
    assert result.errors == [
        "requests-*.jsonl: no file matches this pattern ([[evidence]] #1, kind requests)"
    ]
    assert len(result.files) == 3


def test_status_groups_rejects_by_reason(tmp_path, memory_db):
    path = tmp_path / "bad.jsonl"
    path.write_text(BAD_JSONL)
    ingest_file(memory_db, path, "requests")
    status = evidence_status(memory_db)
    groups = {(g.column, g.reason): g.rows for g in status.rejects}
    assert groups[("prompt_tokens", "not an integer")] == 2
    assert groups[("tenant_id", "required value missing")] == 1
    example = next(g.example for g in status.rejects if g.column == "prompt_tokens")
    assert example == f"{path}:4: not an integer: '12x'"


# --- damaged files: salvage and outcomes ----------------------------------------------------


CUT = {"gz": gzip_cut, "zst": zstd_cut}
CODEC = {"gz": "gzip", "zst": "zstd"}


def jsonl_lines() -> list[str]:
    return [json.dumps(r) + "\n" for r in _rows()]


def request_ids(con) -> list[str]:
    return [
        r[0] for r in con.execute("SELECT request_id FROM requests ORDER BY source_row").fetchall()
    ]


@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_truncated_jsonl_loads_every_complete_line_and_rejects_the_cut_one(
    tmp_path, memory_db, codec
):
    lines = jsonl_lines()
    path = tmp_path / f"r.jsonl.{codec}"
    path.write_bytes(CUT[codec](("".join(lines[:4]) + lines[4][:30]).encode()))
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (5, 4, 1)
    damage = f"truncated {CODEC[codec]} data after {path.stat().st_size:,} bytes"
    assert (result.outcome, result.problem, result.rows_lost) == (
        "partial",
        f"{damage}: any rows after line 4 are lost",
        None,
    )
    assert request_ids(memory_db) == ["req-0", "req-1", "req-2", "req-3"]
    assert rejects(memory_db) == [(5, None, f"line cut by the damage: {damage}")]
    assert memory_db.execute("SELECT raw FROM rejects").fetchone() == (lines[4][:30],)
    ev = memory_db.execute(
        "SELECT rows_read, rows_loaded, rows_rejected, outcome, problem, rows_lost FROM evidence"
    ).fetchone()
    assert ev == (5, 4, 1, "partial", result.problem, None)


def test_gzip_members_before_the_damage_all_load(tmp_path, memory_db):
    lines = jsonl_lines()
    first = gzip.compress("".join(lines[:2]).encode())
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(first + gzip_cut(("".join(lines[2:5]) + lines[5][:10]).encode()))
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_loaded, result.rows_rejected, result.outcome) == (5, 1, "partial")
    assert request_ids(memory_db) == [f"req-{i}" for i in range(5)]
    assert rejects(memory_db)[0][0] == 6


def test_corrupt_gzip_keeps_what_precedes_the_bad_byte(tmp_path, memory_db):
    lines = jsonl_lines()
    good = gzip.compress("".join(lines[:3]).encode())
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(good + b"this is no gzip member" + gzip.compress(lines[3].encode()))
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (3, 3, 0)
    assert result.problem == (
        # zlib knows the header is wrong at its second byte.
        f"corrupt gzip data detected at byte {len(good) + 2:,} of {path.stat().st_size:,} "
        "(incorrect header check): any rows after line 3 are lost"
    )


def test_a_checksum_failure_says_the_rows_read_may_be_damaged(tmp_path, memory_db):
    data = "".join(jsonl_lines()).encode()
    packed = bytearray(gzip.compress(data, compresslevel=0, mtime=0))
    # Level 0 stores the bytes as they are after a 10-byte header and a 5-byte block header:
    # change one digit of a prompt and only the checksum can tell.
    packed[15 + data.index(b"681274")] = ord("9")
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(bytes(packed))
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_loaded, result.rows_rejected, result.outcome) == (6, 0, "partial")
    assert result.problem == (
        # The checksum is the first 4 of the 8 trailer bytes: the mismatch shows at the 4th.
        f"corrupt gzip data detected at byte {len(packed) - 4:,} of {len(packed):,} "
        "(incorrect data check), so the rows read before it may hold damaged values: "
        "any rows after line 6 are lost"
    )


def csv_text(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


CSV_ROWS = [
    ["request_id", "tenant_id", "received_at", "prompt_tokens", "http_status", "user_agent"],
    ["a", "t", "2026-09-08T14:00:00Z", "5", "200", "x"],
    ["b", "t", "2026-09-08T14:00:00Z", "5", "200", "multi\nline"],
    ["c", "t", "2026-09-08T14:00:00Z", "5", "200", "x", "surplus"],
    ["d", "t", "2026-09-08T14:00:00Z", "6", "200", 'say "hi"'],
    ["e", "t", "2026-09-08T14:00:00Z", "7", "200", "first\nsecond"],
]


@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_truncated_csv_loads_every_complete_record_and_rejects_the_cut_one(
    tmp_path, memory_db, codec
):
    text = csv_text(CSV_ROWS)
    # Cut inside the quoted two-line value of the last record, just after its newline: read
    # as it is, that record would load with the value "first" and nothing would say it was cut.
    kept = text[: text.index("second")]
    path = tmp_path / f"r.csv.{codec}"
    path.write_bytes(CUT[codec](kept.encode()))
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (5, 3, 2)
    damage = f"truncated {CODEC[codec]} data after {path.stat().st_size:,} bytes"
    assert result.outcome == "partial"
    assert result.problem == f"{damage}: any rows after data row 4 are lost"
    assert rejects(memory_db) == [
        (3, None, "malformed CSV row: expected 6 fields, found 7"),
        (5, None, f"line cut by the damage: {damage}"),
    ]
    assert memory_db.execute("SELECT raw FROM rejects WHERE source_row = 5").fetchone() == (
        'e,t,2026-09-08T14:00:00Z,7,200,"first\n',
    )
    got = memory_db.execute("SELECT request_id, source_row, user_agent FROM requests ORDER BY 2")
    assert got.fetchall() == [("a", 1, "x"), ("b", 2, "multi\nline"), ("d", 4, 'say "hi"')]


def test_a_csv_cut_inside_its_header_fails(tmp_path, memory_db):
    path = tmp_path / "r.csv.gz"
    path.write_bytes(gzip_cut(b"request_id,tenant_"))
    size = path.stat().st_size
    with pytest.raises(EvidenceError) as err:
        ingest_file(memory_db, path, "requests")
    assert str(err.value) == (
        f"{path}: truncated gzip data after {size:,} bytes, before the end of the CSV header: "
        "no row can be read"
    )


def test_an_uncompressed_file_cut_mid_line_rejects_its_last_line(tmp_path, memory_db):
    lines = jsonl_lines()
    path = tmp_path / "r.jsonl"
    path.write_text("".join(lines[:3]) + lines[3][:40])
    result = ingest_file(memory_db, path, "requests")
    # Nothing tells a cut from a file without a final newline: the line is read, and rejected
    # because it does not parse. The file itself is whole.
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (4, 3, 1)
    assert rejects(memory_db) == [(4, None, "not valid JSON")]
    assert (result.outcome, result.problem) == ("loaded", None)


def test_damaged_parquet_fails_and_says_how_many_rows_it_held(tmp_path):
    rows = [dict(_rows()[i % 6], request_id=f"r{i}") for i in range(200)]
    broken = write(tmp_path / "broken.parquet", rows)
    data = bytearray(broken.read_bytes())
    data[8:400] = bytes(b ^ 0x5A for b in data[8:400])  # the pages; the footer stays readable
    broken.write_bytes(bytes(data))
    packed = write(tmp_path / "packed.parquet", rows, "gz")
    packed.write_bytes(packed.read_bytes()[:-100])
    result = ingest_paths(tmp_path / "case.duckdb", [broken, packed], "requests")
    assert result.files == []
    failed = {f.path.rsplit("/", 1)[-1]: f for f in result.failures}
    assert failed["broken.parquet"].message.startswith("cannot load the file (")
    assert failed["broken.parquet"].rows_lost == 200
    assert failed["packed.parquet.gz"].message == (
        f"truncated gzip data after {packed.stat().st_size:,} bytes: "
        "a Parquet file cannot be read without its end"
    )
    assert failed["packed.parquet.gz"].rows_lost is None
    con = connect(tmp_path / "case.duckdb")
    outcomes = evidence_outcomes(con)
    assert [(o.path, o.outcome, o.rows_lost) for o in outcomes] == [
        (str(broken), "failed", 200),
        (str(packed), "failed", None),
    ]
    assert outcomes[0].sha256 == hashlib.sha256(broken.read_bytes()).hexdigest()


def test_the_file_form_records_failures_until_the_file_loads(tmp_path):
    db = tmp_path / "case.duckdb"
    path = tmp_path / "r.parquet"
    path.write_bytes(b"PAR1 not really")
    first = ingest_paths(db, [path, tmp_path / "none-*.jsonl"], "requests")
    assert [(f.outcome, f.message) for f in first.failures] == [
        ("missing", "no file matches this pattern"),
        ("failed", first.failures[1].message),
    ]
    con = connect(db)
    assert [(o.path, o.outcome) for o in evidence_outcomes(con)] == [
        (str(tmp_path / "none-*.jsonl"), "missing"),
        (str(path), "failed"),
    ]
    con.close()
    write(path, _rows())
    again = ingest_paths(db, [path], "requests")
    assert again.ok and again.problems == []
    con = connect(db)
    # The pattern was not given again, so its record stands; the file's failure is gone.
    assert [(o.path, o.outcome) for o in evidence_outcomes(con)] == [
        (str(tmp_path / "none-*.jsonl"), "missing"),
        (str(path), "loaded"),
    ]


def test_ingest_case_records_the_manifest_as_it_stands_on_each_run(tiny_case_dir):
    manifest = damaged_tiny_case(tiny_case_dir)
    case = load_case(manifest)
    size = (tiny_case_dir / "requests.jsonl.gz").stat().st_size
    partial = (
        f"requests.jsonl.gz: partial (24 rows loaded): truncated gzip data after {size:,} "
        "bytes: any rows after line 24 are lost"
    )
    missing = "alloc-*.csv: no file matches this pattern ([[evidence]] #5, kind kv_allocations)"

    first = ingest_case(case)
    assert not first.ok
    assert first.problems == [missing, partial]
    con = connect(case.database)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (24,)
    assert con.execute(
        "SELECT source, entry, path, kind, format, outcome FROM evidence_failures"
    ).fetchall() == [("manifest", 5, "alloc-*.csv", "kv_allocations", "canonical", "missing")]
    assert [(o.path, o.outcome) for o in evidence_outcomes(con)] == [
        ("alloc-*.csv", "missing"),
        ("engine_legs.jsonl", "loaded"),
        ("pool_snapshots.csv", "loaded"),
        ("requests.jsonl.gz", "partial"),
        ("tenants.csv", "loaded"),
    ]
    con.close()

    # Nothing changed: the partial file is already loaded and is still partial.
    second = ingest_case(case)
    assert all(f.skipped for f in second.files)
    assert second.problems == [missing, partial]

    # The complete file arrives and the allocation log is found: both problems disappear, and
    # the complete file replaces the partial load instead of adding to it.
    full = FIXTURES / "tiny_case" / "requests.jsonl"
    (tiny_case_dir / "requests.jsonl.gz").write_bytes(gzip.compress(full.read_bytes()))
    (tiny_case_dir / "alloc-1.csv").write_text(ALLOC_CSV)
    third = ingest_case(case)
    assert third.ok and third.problems == []
    requests = next(f for f in third.files if f.kind == "requests")
    assert (requests.outcome, requests.rows_loaded, len(requests.replaced)) == ("loaded", 31, 1)
    con = connect(case.database)
    assert con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone() == (
        31,
        31,
    )
    assert con.execute("SELECT count(*) FROM evidence_failures").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM rejects").fetchone() == (0,)
    assert {o.outcome for o in evidence_outcomes(con)} == {"loaded"}


def test_a_pattern_that_matches_nothing_is_missing_even_beside_one_that_matches(tiny_case_dir):
    manifest = tiny_case_dir / "case.toml"
    manifest.write_text(
        manifest.read_text().replace(
            'paths = ["requests.jsonl"]', 'paths = ["requests.jsonl", "more/requests-*.jsonl"]'
        )
    )
    result = ingest_case(load_case(manifest))
    assert result.errors == [
        "more/requests-*.jsonl: no file matches this pattern ([[evidence]] #1, kind requests)"
    ]
    assert result.rows_loaded == 99


def test_a_database_from_before_outcomes_reads_as_loaded_and_gains_the_columns(tmp_path):
    import duckdb

    from forensics.schema import all_ddl

    db = tmp_path / "old.duckdb"
    old = duckdb.connect(str(db))
    # The schema as it was before outcomes: no added columns, no failures table.
    for statement in all_ddl():
        if not statement.startswith("ALTER") and "evidence_failures" not in statement:
            old.execute(statement)
    old.execute(
        "INSERT INTO evidence VALUES (1, 'r.jsonl', 'abc', 10, 'requests', 'canonical', "
        "2, 2, 0, NULL, NULL, TIMESTAMPTZ '2026-09-08 00:00:00+00')"
    )
    old.close()
    # Read-only, nothing is added: the reader falls back to what such a database means.
    con = connect(db, read_only=True)
    assert [(o.path, o.outcome, o.rows_lost) for o in evidence_outcomes(con)] == [
        ("r.jsonl", "loaded", 0)
    ]
    assert [f.outcome for f in evidence_status(con).files] == ["loaded"]
    con.close()
    con = connect(db)
    assert con.execute("SELECT outcome, problem, rows_lost FROM evidence").fetchall() == [
        ("loaded", None, 0)
    ]
    assert con.execute("SELECT count(*) FROM evidence_failures").fetchone() == (0,)
