"""Evidence read in place, the parts that run without Spark: listing a case's files as a local
ingest lists them, and a reading task's work on one file (what each Spark task runs) giving what
a local ingest of that file records. Spark itself: tests/test_spark.py."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa

from forensics.case import load_case
from forensics.db import connect
from forensics.ingest import FileFailure, ingest_file
from forensics.lake import LakeFile, list_evidence, output_schema, read_file

TINY = Path(__file__).parent / "fixtures" / "tiny_case"


def _case(tmp_path: Path) -> Path:
    folder = tmp_path / "case"
    shutil.copytree(TINY, folder)
    text = (folder / "case.toml").read_text()
    text = text.replace('paths = ["requests.jsonl"]', 'paths = ["requests*.jsonl", "gone-*.jsonl"]')
    (folder / "case.toml").write_text(text)
    shutil.copy(folder / "requests.jsonl", folder / "requests-b.jsonl")
    return folder


def test_files_are_listed_in_the_order_and_with_the_names_a_local_ingest_gives(tmp_path):
    case = load_case(_case(tmp_path))
    files, failures = list_evidence(None, case)  # local paths only: Spark is not asked
    assert [(f.order, f.kind, f.label) for f in files] == [
        (1, "requests", "requests-b.jsonl"),
        (2, "requests", "requests.jsonl"),
        (3, "engine_legs", "engine_legs.jsonl"),
        (4, "pool_snapshots", "pool_snapshots.csv"),
        (5, "tenants", "tenants.csv"),
    ]
    assert files[1].url == "file:" + str((case.folder / "requests.jsonl").resolve())
    assert files[1].bytes == (case.folder / "requests.jsonl").stat().st_size
    assert failures == [
        FileFailure(
            "gone-*.jsonl",
            "requests",
            "no file matches this pattern ([[evidence]] #1, kind requests)",
            format="canonical",
            entry=1,
            outcome="missing",
        )
    ]


def _meta(path: Path, kind: str = "requests", order: int = 7) -> LakeFile:
    return LakeFile(
        order=order,
        entry=1,
        kind=kind,
        format="canonical",
        url="file:" + str(path),
        label=f"logs/{path.name}",
        bytes=path.stat().st_size,
        timezone="UTC",
    )


def _parts(batches) -> dict[str, list[dict]]:
    table = pa.Table.from_batches(list(batches))
    parts: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        parts.setdefault(row["__kv_part"], []).append(row)
    return parts


def test_a_reading_task_gives_the_rows_rejects_and_record_a_local_ingest_writes(tmp_path):
    lines = (TINY / "requests.jsonl").read_text().splitlines()
    bad = json.dumps({"request_id": "x", "tenant_id": "t", "received_at": "soon"})
    path = tmp_path / "requests.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join([*lines[:3], bad, *lines[3:]]) + "\n").encode()))
    batches = list(read_file(_meta(path), path.read_bytes()))
    assert all(b.schema.equals(output_schema("requests")) for b in batches)
    parts = _parts(batches)

    local = connect(":memory:")
    done = ingest_file(local, path, "requests", label="logs/requests.jsonl.gz")
    rows = local.sql("SELECT * FROM requests ORDER BY source_row").to_arrow_table()
    # Its canonical rows, under the file's place in the manifest as evidence id.
    assert [r["evidence_id"] for r in parts["row"]] == [7] * done.rows_loaded
    for name in rows.column_names:
        if name not in ("evidence_id", "extra"):
            assert [r[name] for r in parts["row"]] == rows[name].to_pylist(), name
    # Its reject, with the reason and raw line a local ingest keeps.
    rejects = local.execute("SELECT source_row, column_name, reason, raw FROM rejects").fetchall()
    assert [
        (r["source_row"], r["__kv_column"], r["__kv_reason"], r["__kv_raw"])
        for r in parts["reject"]
    ] == rejects
    assert rejects and rejects[0][1] == "received_at"
    # Its record: the evidence row's figures.
    [record] = [json.loads(r["__kv_record"]) for r in parts["evidence"]]
    assert (record["rows_read"], record["rows_loaded"], record["rows_rejected"]) == (
        done.rows_read,
        done.rows_loaded,
        done.rows_rejected,
    )
    assert record["sha256"] == done.sha256 and record["outcome"] == "loaded"


def test_a_reading_task_rejects_the_rows_it_is_told_repeat_others(tmp_path):
    path = tmp_path / "requests.jsonl"
    shutil.copy(TINY / "requests.jsonl", path)
    flags = [(2, "request_id", "exact duplicate: same content as a.jsonl:2, which is loaded")]
    parts = _parts(read_file(_meta(path), path.read_bytes(), flags))
    assert [r["source_row"] for r in parts["reject"]] == [2]
    assert parts["reject"][0]["__kv_reason"] == flags[0][2]
    assert parts["reject"][0]["__kv_raw"].startswith("{")
    assert 2 not in [r["source_row"] for r in parts["row"]]
    [record] = [json.loads(r["__kv_record"]) for r in parts["evidence"]]
    assert (record["rows_rejected"], record["duplicates"]) == (1, 1)


def test_a_file_a_reading_task_cannot_read_is_the_failure_a_local_ingest_records(tmp_path):
    path = tmp_path / "requests.parquet"
    path.write_bytes(b"PAR1 this is not a Parquet file")
    parts = _parts(read_file(_meta(path), path.read_bytes()))
    assert set(parts) == {"failure"}
    [record] = [json.loads(r["__kv_record"]) for r in parts["failure"]]
    local = connect(":memory:")
    try:
        ingest_file(local, path, "requests", label="logs/requests.parquet")
    except Exception as exc:  # noqa: BLE001 - the message is what is compared
        expected = str(exc).removeprefix("logs/requests.parquet: ")
    # The task read a copy: the message names the evidence file, not the copy.
    assert record["message"] == expected.replace(str(path), "logs/requests.parquet")
    assert "kv-forensics-" not in record["message"]
    assert record["sha256"] and record["bytes"] == path.stat().st_size
