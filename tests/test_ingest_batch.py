"""Canonical files of one entry load together (Parquet here, JSON Lines too): the same tables
as loading them one by one."""

from __future__ import annotations

import glob
import gzip
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forensics.db import connect
from forensics.ingest import ingest_file, ingest_paths


def _requests(day: int, n: int = 5, **changes) -> list[dict]:
    return [
        {
            "request_id": f"d{day}-{i}",
            "tenant_id": f"acct_{i % 3}",
            "received_at": f"2026-09-0{day}T10:0{i}:00Z",
            "prompt_tokens": 1000 * (i + 1),
            "http_status": 200,
            **changes,
        }
        for i in range(n)
    ]


def _write(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _day_files(tmp_path: Path) -> list[Path]:
    """Four daily files of the same columns: one with rejects, one repeating rows of day 1
    (one exactly, one with another tenant), then a file with an extra column."""
    day2 = _requests(2)
    day2[1]["prompt_tokens"] = -5  # out of range
    day2[3]["tenant_id"] = ""  # required value missing
    day3 = _requests(3)
    day3[0] = dict(_requests(1)[0])
    day3[2] = dict(_requests(1)[2], tenant_id="acct_other")
    return [
        _write(tmp_path / "r-1.parquet", _requests(1)),
        _write(tmp_path / "r-2.parquet", day2),
        _write(tmp_path / "r-3.parquet", day3),
        _write(tmp_path / "r-4.parquet", _requests(4)),
        _write(tmp_path / "r-5.parquet", _requests(5, user_agent="sdk/1")),
    ]


def _tables(db: Path) -> dict[str, list[tuple]]:
    con = connect(db)
    try:
        return {
            "requests": con.execute(
                "SELECT * EXCLUDE (evidence_id), evidence_id - (SELECT min(evidence_id) "
                "FROM evidence) FROM requests ORDER BY evidence_id, source_row"
            ).fetchall(),
            "rejects": con.execute(
                "SELECT * EXCLUDE (evidence_id) FROM rejects ORDER BY evidence_id, source_row"
            ).fetchall(),
            "evidence": con.execute(
                "SELECT * EXCLUDE (evidence_id, loaded_at) FROM evidence ORDER BY evidence_id"
            ).fetchall(),
        }
    finally:
        con.close()


def test_a_batch_loads_what_loading_file_by_file_loads(tmp_path, batches):
    files = _day_files(tmp_path)
    together = ingest_paths(tmp_path / "together.duckdb", files, "requests")
    # The first four share their columns; the fifth has one more and loads alone.
    assert batches == [4]
    con = connect(tmp_path / "alone.duckdb")
    for path in files:
        ingest_file(con, path, "requests")
    con.close()
    assert _tables(tmp_path / "together.duckdb") == _tables(tmp_path / "alone.duckdb")
    assert [f.rows_loaded for f in together.files] == [5, 3, 3, 5, 5]
    assert [f.rows_rejected for f in together.files] == [0, 2, 2, 0, 0]
    assert [(f.duplicates, f.conflicts) for f in together.files][2] == (1, 1)
    reasons = _tables(tmp_path / "together.duckdb")["rejects"]
    assert [(r[0], r[1], r[2]) for r in reasons] == [
        (str(files[1]), 2, "prompt_tokens"),
        (str(files[1]), 4, "tenant_id"),
        (str(files[2]), 1, "request_id"),
        (str(files[2]), 3, "request_id"),
    ]
    # A repeat names the file it repeats, loaded in the same statement.
    assert reasons[2][3].startswith(f"exact duplicate: same content as {files[0]}:1")


def test_a_file_that_fails_while_read_fails_alone(tmp_path, batches):
    files = _day_files(tmp_path)[:4]
    # Its footer reads (so it joins the batch); its first page does not.
    data = bytearray(files[3].read_bytes())
    data[4:40] = b"\xff" * 36
    files[3].write_bytes(bytes(data))
    result = ingest_paths(tmp_path / "case.duckdb", files, "requests")
    assert batches == [-4]
    assert [f.path for f in result.files] == [str(p) for p in files[:3]]
    assert [f.path for f in result.failures] == [str(files[3])]
    assert result.failures[0].message.startswith("cannot load the file (")
    con = connect(tmp_path / "case.duckdb")
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (11,)
    assert con.execute("SELECT count(*) FROM evidence").fetchone() == (3,)


def test_files_loaded_before_and_repeated_bytes_load_alone(tmp_path, batches):
    files = _day_files(tmp_path)[:4]
    copy = tmp_path / "copy-of-1.parquet"
    copy.write_bytes(files[0].read_bytes())
    ingest_paths(tmp_path / "case.duckdb", files[:1], "requests")
    result = ingest_paths(tmp_path / "case.duckdb", [*files, copy], "requests")
    # r-1 is already loaded and its copy has the same bytes: both skipped, the rest together.
    assert batches == [3]
    assert [f.skipped for f in result.files] == [True, False, False, False, True]
    assert result.rows_loaded == 3 + 3 + 5  # skipped files load nothing


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl.gz"])
def test_progress_shows_the_files_of_a_batch_in_order(tmp_path, batches, suffix):
    files = []
    for day in (1, 2, 3, 4):
        path = tmp_path / f"r-{day}{suffix}"
        if suffix == ".parquet":
            files.append(_write(path, _requests(day)))
        else:
            text = "".join(json.dumps(r) + "\n" for r in _requests(day))
            path.write_bytes(gzip.compress(text.encode()))
            files.append(path)
    calls: list[tuple[str, int, int]] = []
    ingest_paths(
        tmp_path / "case.duckdb", files, "requests", progress=lambda *call: calls.append(call)
    )
    assert batches == [4]
    assert list(dict.fromkeys(label for label, _, _ in calls)) == [str(p) for p in files]
    last = {label: (done, total) for label, done, total in calls}
    assert last == {str(p): (p.stat().st_size, p.stat().st_size) for p in files}


def test_a_file_whose_name_is_a_pattern_loads_itself(tmp_path, batches):
    # DuckDB takes a path as a glob pattern, with no escape: `r[1].parquet` would read
    # `r1.parquet`, and `r*.parquet` every file of the folder.
    decoy = _write(tmp_path / "r1.parquet", _requests(9))
    named = _write(tmp_path / "r[1].parquet", _requests(1))
    starred = _write(tmp_path / "r*.parquet", _requests(2))
    plain = _write(tmp_path / "r-4.parquet", _requests(4))
    patterns = [Path(glob.escape(str(p))) for p in (named, starred, plain)]
    result = ingest_paths(tmp_path / "case.duckdb", patterns, "requests")
    # Neither joins a batch (the one file left loads alone as well).
    assert batches == []
    assert [f.rows_loaded for f in result.files] == [5, 5, 5]
    con = connect(tmp_path / "case.duckdb")
    assert con.execute(
        "SELECT e.path, min(r.request_id) FROM requests r JOIN evidence e USING (evidence_id) "
        "GROUP BY e.path, e.evidence_id ORDER BY e.evidence_id"
    ).fetchall() == [(str(named), "d1-0"), (str(starred), "d2-0"), (str(plain), "d4-0")]
    assert decoy.exists()
    assert not list(Path(tempfile.gettempdir()).glob("kv-forensics-*/evidence.parquet"))


def _checked(monkeypatch) -> list[int]:
    """The evidence ids the exact (file by file) repeat check ran for."""
    import forensics.repeats as repeats

    seen: list[int] = []
    real = repeats.flag_repeats

    def spy(con, kind, eid, *rest):
        seen.append(eid)
        return real(con, kind, eid, *rest)

    monkeypatch.setattr(repeats, "flag_repeats", spy)
    return seen


def test_a_batch_with_no_repeat_skips_the_check_of_each_file(tmp_path, batches, monkeypatch):
    checked = _checked(monkeypatch)
    files = [_write(tmp_path / f"r-{day}.parquet", _requests(day)) for day in (1, 2, 3)]
    result = ingest_paths(tmp_path / "case.duckdb", files, "requests")
    assert batches == [3]
    assert checked == []
    assert [(f.rows_loaded, f.duplicates, f.conflicts) for f in result.files] == [(5, 0, 0)] * 3
    # A second batch whose rows are all new is judged against the first in one look, too.
    more = [_write(tmp_path / f"r-{day}.parquet", _requests(day)) for day in (4, 5)]
    ingest_paths(tmp_path / "case.duckdb", more, "requests")
    assert batches == [3, 2]
    assert checked == []


@pytest.mark.parametrize("where", ["within a file", "across the batch", "a file loaded before"])
def test_a_batch_that_may_repeat_checks_each_file_exactly(tmp_path, batches, monkeypatch, where):
    checked = _checked(monkeypatch)
    first = _write(tmp_path / "r-1.parquet", _requests(1))
    day2, day3 = _requests(2), _requests(3)
    if where == "within a file":
        day3[4] = dict(day3[0])
    else:
        day3[4] = dict(_requests(1 if where == "a file loaded before" else 2)[1])
    files = [_write(tmp_path / "r-2.parquet", day2), _write(tmp_path / "r-3.parquet", day3)]
    if where == "a file loaded before":
        ingest_paths(tmp_path / "case.duckdb", [first], "requests")
    else:
        files.insert(0, first)
    checked.clear()
    result = ingest_paths(tmp_path / "case.duckdb", files, "requests")
    assert batches[-1] == len(files)
    assert len(checked) == len(files)  # every file of the batch, exactly
    assert [f.duplicates for f in result.files] == [0] * (len(files) - 1) + [1]
    assert result.files[-1].rows_loaded == 4


def test_may_repeat_compares_the_whole_identity(tmp_path):
    from forensics.repeats import may_repeat

    con = connect(tmp_path / "case.duckdb")
    con.execute(
        "INSERT INTO engine_legs (evidence_id, source_row, request_id, role, node, started_at) "
        "VALUES (1, 1, 'r1', 'prefill', 'p0', TIMESTAMPTZ '2026-09-01 10:00:00+00'), "
        "(2, 1, 'r1', 'decode', 'd0', TIMESTAMPTZ '2026-09-01 10:00:00+00'), "
        "(2, 2, 'r1', 'prefill', 'p0', TIMESTAMPTZ '2026-09-01 10:00:05+00'), "
        "(3, 1, 'r1', 'prefill', 'p0', TIMESTAMPTZ '2026-09-01 10:00:00+00')"
    )
    # Same request, another role or another start (a retry): not a repeat.
    assert may_repeat(con, "engine_legs", [2]) is False
    # Every identity column equal to evidence 1's row: a repeat.
    assert may_repeat(con, "engine_legs", [3]) is True
    assert may_repeat(con, "engine_legs", [1, 3]) is True
    # A kind with no identity has no repeats.
    assert may_repeat(con, "pool_snapshots", [1]) is False
    con.close()


def test_request_ids_are_stored_uncompressed_and_other_strings_compressed(tmp_path):
    # Unique per row: compressing them costs ingest and every join on them (schema.UNCOMPRESSED).
    rows = [dict(r, tenant_id="acct_1") for day in (1, 2, 3) for r in _requests(day, n=9)]
    ingest_paths(tmp_path / "case.duckdb", [_write(tmp_path / "r.parquet", rows)], "requests")
    con = connect(tmp_path / "case.duckdb")
    con.execute("CHECKPOINT")
    stored = dict(
        con.execute(
            "SELECT column_name, string_agg(DISTINCT compression) FROM"
            " pragma_storage_info('requests') WHERE segment_type = 'VARCHAR'"
            " AND column_name IN ('request_id', 'tenant_id') GROUP BY column_name"
        ).fetchall()
    )
    con.close()
    assert stored["request_id"] == "Uncompressed"
    assert stored["tenant_id"] != "Uncompressed"


def test_files_are_hashed_ahead_within_a_bound_and_as_file_sha256_hashes_them(
    tmp_path, monkeypatch
):
    from forensics.ingest import batch, file_sha256

    monkeypatch.setattr(batch, "BATCH_BYTES", 250)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"f{i}.bin")
        paths[-1].write_bytes(bytes([i]) * 100)
    missing = tmp_path / "gone.bin"
    hashes = batch.HashesAhead([*paths[:3], missing, *paths[3:]])
    try:
        assert hashes.get(paths[0]) == file_sha256(paths[0])
        # f0 asked for, then f1, f2 and the missing file (0 bytes) and f3: 300 bytes ahead.
        assert hashes._next == 5
        # f1 is passed over (its hash dropped), f2 asked for: the bound moves with it, to the
        # missing file, f3, f4 and f5 (300 bytes ahead; the file that passes it is the last).
        assert hashes.get(paths[2]) == file_sha256(paths[2])
        assert sorted(hashes._futures) == [3, 4, 5, 6]
        with pytest.raises(FileNotFoundError):
            hashes.get(missing)
        # A file not among those to come, or asked for again, is hashed then and there.
        assert hashes.get(paths[0]) == file_sha256(paths[0])
        assert [hashes.get(p) for p in paths[3:]] == [file_sha256(p) for p in paths[3:]]
        assert hashes._futures == {}
    finally:
        hashes.close()
