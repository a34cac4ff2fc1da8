"""Hostile evidence: byte-order marks, CRLF, a 10 MB line, binary garbage, an exclusion rule shaped
like SQL injection, and a fuzz run over the canonical readers. Every row is loaded or rejected
with a reason, and nothing raises but a one-line error naming the file."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from forensics.cli import app
from forensics.db import connect
from forensics.errors import EvidenceError
from forensics.ingest import ingest_file

TINY = Path(__file__).parent / "fixtures" / "tiny_case"
ROW = {
    "request_id": "r1",
    "tenant_id": "acct_a",
    "received_at": "2026-09-08T14:00:00Z",
    "prompt_tokens": 5,
    "http_status": 200,
}
HEADER = "request_id,tenant_id,received_at,prompt_tokens,http_status\n"


def got(con) -> list[tuple]:
    return con.execute(
        "SELECT request_id, tenant_id, prompt_tokens, source_row FROM requests ORDER BY source_row"
    ).fetchall()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".csv", ".csv.gz"])
def test_a_byte_order_mark_and_crlf_line_ends_read_as_plain_text(tmp_path, memory_db, suffix):
    if suffix.startswith(".jsonl"):
        text = "".join(json.dumps(dict(ROW, request_id=f"r{i}")) + "\r\n" for i in range(3))
    else:
        text = HEADER + "".join(f"r{i},acct_a,2026-09-08T14:00:00Z,5,200\r\n" for i in range(3))
    data = b"\xef\xbb\xbf" + text.encode()
    path = tmp_path / f"r{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (3, 3, 0)
    assert got(memory_db) == [(f"r{i}", "acct_a", 5, i + 1) for i in range(3)]


def test_a_10_mb_line_is_read_whole(tmp_path, memory_db):
    agent = "x" * (10 << 20)
    lines = [
        json.dumps(dict(ROW, user_agent=agent)),
        "{" + "y" * (10 << 20),  # 10 MB that is no JSON
        json.dumps(dict(ROW, request_id="r2")),
    ]
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (3, 2, 1)
    assert memory_db.execute(
        "SELECT length(user_agent) FROM requests WHERE request_id = 'r1'"
    ).fetchone() == (10 << 20,)
    reject = memory_db.execute("SELECT source_row, reason, length(raw) FROM rejects").fetchone()
    assert reject == (2, "not valid JSON", (10 << 20) + 1)


def test_binary_garbage_between_good_lines_is_rejected_line_by_line(tmp_path, memory_db):
    good = json.dumps(ROW).encode()
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        good
        + b"\n\x00\x01\x02\xff\xfe garbage\n"
        + json.dumps(dict(ROW, request_id="r2", tenant_id="acct_\xe9"), ensure_ascii=False).encode(
            "latin-1"
        )
        + b"\n\x89PNG\r\n\x1a\n"
        + json.dumps(dict(ROW, request_id="r3")).encode()
        + b"\n"
    )
    result = ingest_file(memory_db, path, "requests")
    # Line 3 is not UTF-8 (latin-1 é): read with a replacement character, not dropped. The PNG
    # signature holds a newline: lines 4 and 5.
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (6, 3, 3)
    assert [(r[0], r[1], r[3]) for r in got(memory_db)] == [
        ("r1", "acct_a", 1),
        ("r2", "acct_\ufffd", 3),
        ("r3", "acct_a", 6),
    ]
    assert memory_db.execute("SELECT source_row, reason FROM rejects ORDER BY 1").fetchall() == [
        (2, "not valid JSON"),
        (4, "not valid JSON"),
        (5, "not valid JSON"),
    ]


def test_rows_after_malformed_csv_rows_keep_their_numbers(tmp_path, memory_db):
    good = "r{},acct_a,2026-09-08T14:00:00Z,5,200\n"
    path = tmp_path / "r.csv"
    path.write_text(HEADER + "a,b,c,d,e,f\n" * 2 + good.format(3) + "x\n" * 3 + good.format(7))
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (7, 2, 5)
    assert [(r[0], r[3]) for r in got(memory_db)] == [("r3", 3), ("r7", 7)]


def test_a_malformed_csv_row_that_is_not_utf8_fails_the_file_quietly(tmp_path, memory_db, capfd):
    path = tmp_path / "r.csv"
    path.write_bytes(HEADER.encode() + b"r1,acct_a,2026-09-08T14:00:00Z,5,200\nr2,a\xc2,x,y,z,w\n")
    with pytest.raises(EvidenceError) as err:
        ingest_file(memory_db, path, "requests")
    assert str(err.value) == f"{path}: not valid UTF-8 text, so not a CSV file"
    assert capfd.readouterr().err == ""


INJECTIONS = ["acct_alpha' OR '1'='1", "x'); DROP TABLE requests; --", '" OR ""="']


def test_an_exclusion_rule_shaped_like_sql_injection_matches_only_its_literal_tenant(tmp_path):
    folder = tmp_path / "case"
    shutil.copytree(TINY, folder, ignore=shutil.ignore_patterns("*.duckdb*"))
    # One request of a tenant whose id is the injection itself: the only one to be excluded.
    row = json.loads((folder / "requests.jsonl").read_text().splitlines()[0])
    with (folder / "requests.jsonl").open("a") as fh:
        fh.write(json.dumps(row | {"request_id": "req-999", "tenant_id": INJECTIONS[0]}) + "\n")
    rule = (
        '\n[[exclusion]]\nname = "quoted"\nreason = "test"\n'
        f"tenant_ids = {json.dumps(INJECTIONS)}\n"
        'user_agent_regex = "\' OR 1=1 --"\n'
        'api_key_ids = ["key\'; DELETE FROM findings_excluded; --"]\n'
    )
    (folder / "case.toml").write_text((folder / "case.toml").read_text() + rule)
    result = CliRunner().invoke(app, ["ingest", str(folder / "case.toml")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["detect", str(folder / "case.toml")])
    assert result.exit_code == 0, result.output
    con = connect(folder / "case.duckdb", read_only=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (32,)
    assert con.execute(
        "SELECT request_id, tenant_id FROM findings_excluded WHERE exclusion = 'quoted'"
    ).fetchall() == [("req-999", INJECTIONS[0])]
    assert con.execute(
        "SELECT requests_matched, tenants_matched FROM findings_exclusions WHERE name = 'quoted'"
    ).fetchone() == (1, 1)
    # The researcher's rule still matches what it did.
    assert (
        con.execute(
            "SELECT count(*) FROM findings_excluded WHERE exclusion = 'researcher'"
        ).fetchone()[0]
        > 0
    )


# --- fuzz: generated bytes through the canonical readers ------------------------------------

_shared: list = []


def _db():
    """One in-memory database for the fuzz run, emptied before each file."""
    if not _shared:
        _shared.append(connect(":memory:"))
    con = _shared[0]
    for table in ("requests", "rejects", "evidence"):
        con.execute(f"DELETE FROM {table}")
    return con


def _ingest(data: bytes, suffix: str):
    """Load ``data`` as one file; returns (result or None, connection). A whole-file failure
    must be an EvidenceError of one printable line naming the file."""
    con = _db()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"fuzz{suffix}"
        path.write_bytes(data)
        try:
            result = ingest_file(con, path, "requests")
        except EvidenceError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and "\n" not in message, message
            assert con.execute("SELECT count(*) FROM requests").fetchone() == (0,)
            return None, con
    read, loaded, rejected = con.execute(
        "SELECT rows_read, rows_loaded, rows_rejected FROM evidence"
    ).fetchone()
    assert (read, loaded, rejected) == (
        result.rows_read,
        result.rows_loaded,
        result.rows_rejected,
    )
    assert read == loaded + rejected
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (loaded,)
    assert con.execute("SELECT count(*) FROM rejects").fetchone() == (rejected,)
    # Every row is accounted for once: loaded or rejected, never both, never twice.
    rows = con.execute(
        "SELECT source_row FROM requests UNION ALL SELECT source_row FROM rejects"
    ).fetchall()
    assert len(rows) == len(set(rows)) == read
    return result, con


def _source_rows(con) -> set[int]:
    return {
        r[0]
        for r in con.execute(
            "SELECT source_row FROM requests UNION ALL SELECT source_row FROM rejects"
        ).fetchall()
    }


values = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)
good_line = st.fixed_dictionaries(
    {k: st.one_of(st.just(v), values) for k, v in ROW.items()},
    optional={"user_agent": values, "ttft_ms": values, "completed_at": values, "x": values},
).map(lambda d: json.dumps(d, allow_nan=True).encode())
line = st.one_of(
    good_line,
    good_line.flatmap(lambda b: st.integers(0, len(b)).map(lambda i: b[:i])),  # cut short
    st.binary(max_size=40),
    st.sampled_from([b"", b"  ", b"\t\r", b"\xef\xbb\xbf{}", b"[]", b"null", b'"s"', b"{}"]),
)
jsonl_bytes = st.tuples(st.lists(line, max_size=12), st.sampled_from([b"\n", b"\r\n"])).map(
    lambda t: t[1].join(t[0])
)

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Nothing may reach the screen either (an "exception ignored" report prints a traceback).
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


@FUZZ
@given(jsonl_bytes)
def test_fuzz_jsonl(data):
    result, con = _ingest(data, ".jsonl")
    if result is None:
        return
    # The rows are the lines that are not blank, numbered as lines.
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    expected = {
        i
        for i, text_line in enumerate(text.split("\n"), 1)
        if not re.fullmatch(r"[ \t\r]*", text_line)
    }
    assert _source_rows(con) == expected


csv_field = st.one_of(
    st.sampled_from(["r1", "acct_a", "2026-09-08T14:00:00Z", "5", "200", "", '"', '""', ","]),
    st.text(max_size=8),
)
csv_bytes = st.tuples(
    st.lists(st.lists(csv_field, min_size=0, max_size=7), max_size=10),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
).map(
    lambda t: (
        HEADER.replace("\n", t[1]) + "".join(_csv_line(fields, t[1], quote=t[2]) for fields in t[0])
    ).encode("utf-8", errors="surrogatepass")
)


def _csv_line(fields: list[str], end: str, quote: bool) -> str:
    if quote:
        buf = io.StringIO()
        csv.writer(buf, lineterminator=end).writerow(fields)
        return buf.getvalue()
    return ",".join(fields) + end  # raw: stray quotes, ragged rows


@FUZZ
@given(st.one_of(csv_bytes, st.binary(max_size=200)))
def test_fuzz_csv(data):
    result, con = _ingest(data, ".csv")
    if result is not None:
        # Data rows are numbered 1..n, malformed ones included.
        assert _source_rows(con) == set(range(1, result.rows_read + 1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(jsonl_bytes, csv_bytes),
    st.sampled_from([".jsonl.gz", ".csv.gz"]),
    st.floats(0, 1),
    st.booleans(),
)
def test_fuzz_compressed_and_damaged(data, suffix, cut, flip):
    packed = bytearray(gzip.compress(data, mtime=0))
    if flip and len(packed) > 12:
        packed[10 + int(cut * (len(packed) - 11))] ^= 0x55
    else:
        packed = packed[: max(1, int(len(packed) * cut))]
    _ingest(bytes(packed), suffix)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.sampled_from([".parquet", ".parquet.gz", ".jsonl.zst"]))
def test_fuzz_binary_files(data, suffix):
    _ingest(data, suffix)
