"""Evidence read where it lies, by Spark: no evidence file is loaded on this machine.

A large provider's logs for an incident window sit as files in a data lake (``s3a://``,
``gs://``, ``abfss://``, HDFS) or a shared folder beside a Spark cluster: more rows than one
machine should load. With ``[engine] evidence = "in-place"`` (or ``--in-place``), detection on
Spark reads them there:

1. Each [[evidence]] pattern is listed where it lies: a local path as a local ingest lists it,
   a URI through the cluster's own file systems and credentials. A pattern that matches
   nothing is missing evidence, as in a local ingest.
2. Each file is read by a Spark task that runs this package's own ingest on it
   (:func:`forensics.ingest.ingest_file`, into a scratch DuckDB inside the task): the same
   readers, adapters, casts and reasons, so a row is loaded or rejected alike either way. The
   task hands back the file's canonical rows, its rejects and its evidence record.
3. Repeats of an event are judged across every file of a kind at once
   (:func:`forensics.repeats.repeats_sql`, translated for Spark), as loading the files in
   their order judges them; a file holding a repeat is read once more with those rows flagged,
   so each reject keeps its raw text. A file with the bytes of an earlier one is skipped.
4. What the tasks wrote (as Parquet, into the staging folder) is the evidence tables
   detection reads, as views: each file's rows under its final evidence id, with a row id.
   Into the case database go the small kinds (pool snapshots, tenants) and the
   bookkeeping (``evidence``, ``rejects``,
   ``evidence_failures``): every file with its sha256 and counts, every reject with its
   reason. Its ``requests``, ``engine_legs`` and ``kv_allocations`` stay empty and
   ``evidence_in_place`` says how many rows each holds where it lies, so that a detection
   that does not read in place refuses the case rather than find nothing in it.

Scoping and the report read only the findings and those small tables (``forensics.summary``),
so they run as after any detection.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from forensics.case import Case
    from forensics.ingest import FileFailure, FileResult, IngestResult

# The kinds whose rows stay where they lie: the case database holds none of them.
LARGE_KINDS = ("requests", "engine_legs", "kv_allocations")
# The kinds the report reads: copied into the case database whole (one row per node snapshot,
# per tenant).
SMALL_KINDS = ("pool_snapshots", "tenants")

# Spark's binaryFile source reads a file into one value: at most 2 GiB.
MAX_FILE_BYTES = (1 << 31) - 1

# A row id for the evidence tables on Spark, unique without numbering every row in one
# place: the file's evidence id above its row number (files of up to 2**40 rows).
ROW_BITS = 40

# What each output row of a reading task is: a canonical row, a reject, or the file's record.
_PART = "__kv_part"
_EXTRA_COLUMNS = (
    (_PART, "VARCHAR"),
    ("__kv_column", "VARCHAR"),
    ("__kv_reason", "VARCHAR"),
    ("__kv_raw", "VARCHAR"),
    ("__kv_record", "VARCHAR"),
)


class LakeError(ForensicsError):
    """Evidence read in place could not be read: one line saying which and why."""


@dataclass(frozen=True)
class LakeFile:
    """One evidence file to read where it lies.

    ``order`` is its place in the manifest (entries in order, each one's files sorted): the
    evidence id it is read under, and the order repeats are judged in. ``url`` is where Spark
    reads it; ``label`` what ``evidence.path`` records (relative to the case folder where it
    lies inside it, else the path or URI as listed).
    """

    order: int
    entry: int
    kind: str
    format: str
    url: str
    label: str
    bytes: int
    timezone: str
    defaults: dict[str, Any] = field(default_factory=dict)
    tenant_field: str | None = None
    memory_limit: str | None = None


# --- listing --------------------------------------------------------------------------------


def list_evidence(session: SparkSession, case: Case) -> tuple[list[LakeFile], list[FileFailure]]:
    """Every file of every [[evidence]] entry, in the order a local ingest loads them, and
    one failure per pattern that matches nothing."""
    from forensics.case import is_uri
    from forensics.ingest import FileFailure, entry_defaults, file_label

    files: list[LakeFile] = []
    failures: list[FileFailure] = []
    for i, entry in enumerate(case.evidence, start=1):
        found: dict[str, tuple[str, int]] = {}  # url -> (label, bytes), each file once
        for pattern in entry.paths:
            if is_uri(pattern):
                matches = [(url, url, size) for url, size in _glob(session, pattern)]
            else:
                local = replace(entry, paths=(pattern,)).files()
                matches = [
                    (_file_url(p), file_label(p, case.folder), p.stat().st_size)
                    for p in local
                    if p.is_file()
                ]
            if not matches:
                label = pattern if is_uri(pattern) else file_label(Path(pattern), case.folder)
                failures.append(
                    FileFailure(
                        label,
                        entry.kind,
                        f"no file matches this pattern ([[evidence]] #{i}, kind {entry.kind})",
                        format=entry.format,
                        entry=i,
                        outcome="missing",
                    )
                )
            for url, label, size in matches:
                found.setdefault(url, (label, size))
        defaults = entry_defaults(entry.kind, entry)
        for url, (label, size) in found.items():
            files.append(
                LakeFile(
                    order=len(files) + 1,
                    entry=i,
                    kind=entry.kind,
                    format=entry.format,
                    url=url,
                    label=label,
                    bytes=size,
                    timezone=case.timezone,
                    defaults=defaults,
                    tenant_field=entry.tenant_field,
                    memory_limit=case.memory_limit,
                )
            )
    return files, failures


def _file_url(path: Path) -> str:
    """A local file as a URL every Hadoop file system reads as local (``file:/abs/path``)."""
    return "file:" + str(path.resolve())


def _file_of(url: str) -> str:
    """What ``evidence_failures.file`` records of a file: a local file's resolved path, as a
    local ingest records it, else the URL."""
    return url[len("file:") :] if url.startswith("file:/") else url


def _hadoop_path(session: SparkSession, url: str):
    jvm = session.sparkContext._jvm  # noqa: SLF001 - the Hadoop file systems live in the JVM
    assert jvm is not None  # a running session has one
    path = jvm.org.apache.hadoop.fs.Path(url)
    conf = session.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
    return path, path.getFileSystem(conf)


def _glob(session: SparkSession, pattern: str) -> list[tuple[str, int]]:
    """The files a URI pattern matches, sorted, with their sizes: Hadoop's glob, on the file
    system the scheme names, with the cluster's credentials."""
    try:
        path, fs = _hadoop_path(session, pattern)
        statuses = fs.globStatus(path)
    except Exception as exc:  # noqa: BLE001 - py4j: a missing bucket, bad credentials
        from forensics.sparkerrors import error_line

        raise LakeError(f"{pattern}: cannot list it ({error_line(exc)})") from None
    found = [(s.getPath().toString(), int(s.getLen())) for s in statuses or [] if s.isFile()]
    return sorted(found)


def remove(session: SparkSession, url: str) -> None:
    """Delete a folder of the staging area, wherever it lies (the staged evidence holds every
    customer's data: it does not outlive the run)."""
    try:
        path, fs = _hadoop_path(session, url)
        fs.delete(path, True)
    except Exception:  # noqa: BLE001 - the session is gone: nothing more can be deleted
        return


# --- one file, inside a Spark task ----------------------------------------------------------


@functools.cache
def table_columns(kind: str) -> tuple[tuple[str, str], ...]:
    """The canonical table's columns with their DuckDB types, as a case database has them."""
    from forensics.db import connect

    con = connect(":memory:")
    return tuple((name, dtype) for name, dtype, *_ in con.execute(f"DESCRIBE {kind}").fetchall())


_ARROW_TYPES = {
    "VARCHAR": "string",
    "JSON": "string",
    "BIGINT": "int64",
    "INTEGER": "int32",
    "DOUBLE": "float64",
    "BOOLEAN": "bool",
    "TIMESTAMP WITH TIME ZONE": "timestamp",
}
_SPARK_TYPES = {
    "VARCHAR": "STRING",
    "JSON": "STRING",
    "BIGINT": "BIGINT",
    "INTEGER": "INT",
    "DOUBLE": "DOUBLE",
    "BOOLEAN": "BOOLEAN",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMP",
}


def _output_columns(kind: str) -> tuple[tuple[str, str], ...]:
    return table_columns(kind) + _EXTRA_COLUMNS


def output_schema(kind: str) -> pa.Schema:
    """The Arrow schema of what a reading task returns for one kind: the canonical columns,
    what the row is (``__kv_part``), a reject's column, reason and raw text, a record."""
    import pyarrow as pa

    fields = []
    for name, dtype in _output_columns(kind):
        arrow = _ARROW_TYPES[dtype]
        fields.append(
            pa.field(name, pa.timestamp("us", tz="UTC") if arrow == "timestamp" else arrow)
        )
    return pa.schema(fields)


def spark_schema(kind: str) -> str:
    """The same schema as a Spark DDL string."""
    return ", ".join(f"`{name}` {_SPARK_TYPES[dtype]}" for name, dtype in _output_columns(kind))


def read_file(
    meta: LakeFile,
    content: bytes,
    flags: list[tuple[int, str | None, str]] | None = None,
    batch_rows: int = 65_536,
) -> Iterator[pa.RecordBatch]:
    """Read one evidence file's bytes as a local ingest would, and give back its canonical
    rows (under evidence id ``meta.order``), its rejects and its record, as batches of
    :func:`output_schema`.

    Repeats are not judged here (they are, across every file at once); ``flags`` are rows
    to reject as repeats found that way. A file that cannot be read gives one ``failure``
    record, with what a local ingest would record of it.
    """
    import tempfile

    from forensics.db import connect
    from forensics.errors import ResourceError
    from forensics.ingest import failure_message, ingest_file, rows_in
    from forensics.readers import sql_str

    schema = output_schema(meta.kind)
    scratch = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
    with tempfile.TemporaryDirectory(prefix="kv-forensics-", dir=scratch) as tmp:
        # The file under its own name: its suffixes tell the reader what it is.
        path = Path(tmp) / (Path(meta.label).name or "evidence")
        path.write_bytes(content)
        del content
        con = connect(":memory:", memory_limit=meta.memory_limit or "2GB")
        con.execute(f"SET temp_directory = {sql_str(str(Path(tmp) / 'spill'))}")
        try:
            result = ingest_file(
                con,
                path,
                meta.kind,
                meta.format,
                timezone=meta.timezone,
                defaults=meta.defaults,
                label=meta.label,
                tenant_field=meta.tenant_field,
                check_duplicates=False,
                flags=flags,
            )
        except ResourceError:
            raise
        except ForensicsError as exc:
            record = {
                # A reader may name the file it opened: the task's copy, which means nothing
                # to a reader of the report. It is the evidence file.
                "message": failure_message(exc, meta.label).replace(str(path), meta.label),
                "sha256": getattr(exc, "sha256", None),
                "bytes": getattr(exc, "bytes", None),
                "rows_lost": rows_in(path),
            }
            yield _record_batch(con, meta, "failure", record, schema)
            return
        canonical = [name for name, _ in table_columns(meta.kind)]
        picks = ", ".join(
            f"{meta.order}::INTEGER AS evidence_id"
            if name == "evidence_id"
            else f'"{name}"::VARCHAR AS "{name}"'
            if name == "extra"
            else f'"{name}"'
            for name in canonical
        )
        rows = con.sql(
            f"SELECT {picks}, 'row' AS {_PART}, NULL::VARCHAR AS __kv_column, "
            "NULL::VARCHAR AS __kv_reason, NULL::VARCHAR AS __kv_raw, "
            f"NULL::VARCHAR AS __kv_record FROM {meta.kind} ORDER BY source_row"
        ).to_arrow_reader(batch_rows)
        for batch in rows:
            yield from _conform(batch, schema)
        blanks = ", ".join(
            f"{meta.order}::INTEGER AS evidence_id"
            if name == "evidence_id"
            else "source_row"
            if name == "source_row"
            else f'NULL::{"VARCHAR" if dtype == "JSON" else dtype} AS "{name}"'
            for name, dtype in table_columns(meta.kind)
        )
        rejects = con.sql(
            f"SELECT {blanks}, 'reject' AS {_PART}, column_name AS __kv_column, "
            "reason AS __kv_reason, raw AS __kv_raw, NULL::VARCHAR AS __kv_record "
            "FROM rejects ORDER BY source_row"
        ).to_arrow_reader(batch_rows)
        for batch in rejects:
            yield from _conform(batch, schema)
        yield _record_batch(con, meta, "evidence", _result_record(result), schema)
        con.close()


def _result_record(result: FileResult) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "sha256": result.sha256,
        "bytes": result.bytes,
        "format": result.format,
        "rows_read": result.rows_read,
        "rows_loaded": result.rows_loaded,
        "rows_rejected": result.rows_rejected,
        "first_at": iso(result.first_at),
        "last_at": iso(result.last_at),
        "outcome": result.outcome,
        "problem": result.problem,
        "rows_lost": result.rows_lost,
        "duplicates": result.duplicates,
        "conflicts": result.conflicts,
    }


def _record_batch(
    con: duckdb.DuckDBPyConnection, meta: LakeFile, part: str, record: dict, schema: pa.Schema
) -> pa.RecordBatch:
    import pyarrow as pa

    values: dict[str, list[Any]] = {name: [None] for name in schema.names}
    values["evidence_id"] = [meta.order]
    values[_PART] = [part]
    values["__kv_record"] = [json.dumps(record, sort_keys=True)]
    return pa.RecordBatch.from_pydict(values, schema=schema)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """A batch of DuckDB's in the output schema; an empty one is not handed on."""
    import pyarrow as pa

    if batch.num_rows:
        yield from pa.Table.from_batches([batch]).select(schema.names).cast(schema).to_batches()


def _reading_task(files: dict[str, LakeFile], flags):
    """The function each Spark task runs over its files: ``(path, content)`` batches in, the
    rows of :func:`read_file` out. ``flags`` is a Spark broadcast of the rows to flag, by
    file (there may be millions: each executor receives them once, not each task)."""

    def read(batches):
        for batch in batches:
            paths = batch.column("path").to_pylist()
            contents = batch.column("content")
            for i, path in enumerate(paths):
                meta = files[path]
                yield from read_file(meta, contents[i].as_py(), flags.value.get(meta.order))

    return read


# --- the whole read, driven from here -------------------------------------------------------


@dataclass
class LakeRead:
    """What reading a case's evidence in place gave: an ingest's result, and the staged
    folders to remove when detection is done."""

    ingested: IngestResult
    staged: list[str]
    changed: list[str] = field(default_factory=list)


def read_in_place(
    ws: Any,
    con: duckdb.DuckDBPyConnection,
    case: Case,
    staging: str,
    step=None,
) -> LakeRead:
    """Read every evidence file of ``case`` where it lies, make the workspace's evidence
    tables of them, and write the small kinds and the bookkeeping into the case database
    (see the module's docstring). ``staging`` is a folder URL every executor can write and
    read. Returns the ingest's result (per file and failure, as a local ingest gives it)."""
    from forensics.ingest import FileFailure, IngestResult
    from forensics.repeats import repeats_sql

    session = ws.session

    def say(what: str, done: int = 0, total: int = 0) -> None:
        if step:
            step(what, done, total)

    say("Listing the evidence where it lies")
    files, failures = list_evidence(session, case)
    # Spark reads a file whole into one task, and no file of more than 2 GiB.
    for f in files:
        if f.bytes > MAX_FILE_BYTES:
            failures.append(
                FileFailure(
                    f.label,
                    f.kind,
                    f"{f.bytes:,} bytes: a file read in place is read whole by one Spark task, "
                    "which takes at most 2 GiB; split it, or load it with forensics ingest",
                    format=f.format,
                    entry=f.entry,
                    bytes=f.bytes,
                    file=_file_of(f.url),
                )
            )
    files = [f for f in files if f.bytes <= MAX_FILE_BYTES]
    staged: list[str] = []
    by_kind: dict[str, list[LakeFile]] = {}
    for f in files:
        by_kind.setdefault(f.kind, []).append(f)
    outputs: dict[str, DataFrame] = {}
    for n, (kind, mine) in enumerate(by_kind.items()):
        say(f"Reading {kind} where it lies ({len(mine):,} files)", n, len(by_kind))
        target = f"{staging}/read-{kind}"
        staged.append(target)
        outputs[kind] = _read(session, mine, {}, target)
    records = _records(outputs)
    result = IngestResult(failures=list(failures))
    kept = _judge_records(files, records, result)
    # Repeats, across every file of a kind at once.
    ws.register_dataframe(
        "lake_files",
        session.createDataFrame(
            [(f.order, f.label) for f in files if f.order in kept] or [(0, "")],
            "evidence_id INT, path STRING",
        ),
    )
    rows: dict[str, DataFrame] = {}
    rejects: dict[str, DataFrame] = {}
    for kind, mine in by_kind.items():
        from pyspark.sql import functions as F

        out = outputs[kind]
        ours = [f.order for f in mine if f.order in kept]
        out = out.filter(F.col("evidence_id").isin(ours)) if ours else out.limit(0)
        kind_rows = out.filter(F.col(_PART) == "row")
        sql = repeats_sql(kind, "lake_rows", "lake_files")
        if sql is not None and ours:
            say(f"Judging repeated {kind} across files")
            ws.register_dataframe("lake_rows", kind_rows)
            flagged = ws.sql(sql).to_arrow_table().to_pylist()
            ws.unregister("lake_rows")
            flags: dict[int, list] = {}
            for r in flagged:
                flags.setdefault(r["evidence_id"], []).append(
                    (r["source_row"], r["column_name"], r["reason"])
                )
            if flags:
                again = [f for f in mine if f.order in flags]
                say(f"Reading again the {len(again):,} {kind} files holding repeats")
                target = f"{staging}/again-{kind}"
                staged.append(target)
                second = _read(session, again, flags, target)
                records.update(_records({kind: second}))
                out = out.filter(~F.col("evidence_id").isin(list(flags))).unionByName(second)
                kind_rows = out.filter(F.col(_PART) == "row")
        rows[kind] = kind_rows
        rejects[kind] = out.filter(F.col(_PART) == "reject")
    ws.unregister("lake_files")
    ids = {order: i for i, order in enumerate(kept, start=1)}
    result.files = _file_results(files, records, kept, ids, result.files)
    say("Making the evidence tables")
    for kind in LARGE_KINDS + SMALL_KINDS:
        _stage_table(ws, kind, rows.get(kind), ids)
    changed = _write_case_database(con, case, ws, files, records, kept, ids, rejects, result)
    return LakeRead(result, staged, changed)


def _read(
    session: SparkSession, files: list[LakeFile], flags: dict[int, list], target: str
) -> DataFrame:
    """One Spark job reading ``files`` (one task a file), its output written to ``target``
    and read back from there."""
    from forensics.sparkerrors import SparkError, error_line, is_spark_error

    wanted = {_normal(f.url): f for f in files}
    # A file a task at a time, and one file a batch: a task holds one file's bytes.
    conf = {
        "spark.sql.files.openCostInBytes": str(1 << 40),
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1",
    }
    saved: dict[str, str | None] = {key: session.conf.get(key, None) for key in conf}
    for key, setting in conf.items():
        session.conf.set(key, setting)
    try:
        listing = session.read.format("binaryFile").load([f.url for f in files])
        # Spark names each file by its qualified path: ours, written its own way.
        named = {}
        for row in listing.select("path").collect():
            meta = wanted.get(_normal(row.path))
            if meta is not None:
                named[row.path] = meta
        unread = sorted(set(wanted) - {_normal(p) for p in named})
        if unread:
            raise LakeError(f"{unread[0]}: Spark did not list it; it cannot be read")
        task = _reading_task(named, session.sparkContext.broadcast(flags))
        out = listing.select("path", "content").mapInArrow(task, spark_schema(files[0].kind))
        out.write.mode("overwrite").parquet(target)
    except ForensicsError:
        raise
    except Exception as exc:
        if type(exc).__name__ not in ("Py4JJavaError", "PythonException", "AnalysisException"):
            if not is_spark_error(exc):
                raise
        raise SparkError(f"{error_line(exc)} (in: reading the evidence where it lies)") from None
    finally:
        for key, before in saved.items():
            if before is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, before)
    return session.read.parquet(target)


def _normal(url: str) -> str:
    """A file's URL in one spelling: Spark writes a local file ``file:/a`` where we may write
    ``file:///a``, and may percent-encode what we do not.

    >>> _normal("file:///tmp/a b.jsonl"), _normal("file:/tmp/a%20b.jsonl")
    ('file:/tmp/a b.jsonl', 'file:/tmp/a b.jsonl')
    """
    from urllib.parse import unquote

    text = unquote(url)
    if text.startswith("file:"):
        text = "file:/" + text[len("file:") :].lstrip("/")
    return text


def _records(outputs: dict[str, DataFrame]) -> dict[int, tuple[str, dict]]:
    """Each file's record (its evidence row, or its failure), by its order."""
    from pyspark.sql import functions as F

    found: dict[int, tuple[str, dict]] = {}
    for out in outputs.values():
        part = F.col(_PART)
        picked = out.filter((part == "evidence") | (part == "failure"))
        for row in picked.select("evidence_id", _PART, "__kv_record").collect():
            found[row["evidence_id"]] = (row[_PART], json.loads(row["__kv_record"]))
    return found


def _judge_records(
    files: list[LakeFile], records: dict[int, tuple[str, dict]], result: IngestResult
) -> list[int]:
    """The files that load, in order: a failed one is a failure, one with the bytes of an
    earlier file is skipped (another kind's: refused), as a local ingest does."""
    from forensics.ingest import FileFailure

    kept: list[int] = []
    first: dict[str, LakeFile] = {}
    for f in files:
        part, record = records.get(f.order, ("failure", {"message": "the file was not read"}))
        if part == "failure":
            result.failures.append(
                FileFailure(
                    f.label,
                    f.kind,
                    record["message"],
                    format=f.format,
                    entry=f.entry,
                    sha256=record.get("sha256"),
                    bytes=record.get("bytes"),
                    rows_lost=record.get("rows_lost"),
                    file=_file_of(f.url),
                )
            )
            continue
        sha = record["sha256"]
        earlier = first.get(sha)
        if earlier is not None and earlier.kind != f.kind:
            result.failures.append(
                FileFailure(
                    f.label,
                    f.kind,
                    f"the same file (sha256 {sha[:12]}) is already loaded as kind "
                    f"{earlier.kind} from {earlier.label}",
                    format=f.format,
                    entry=f.entry,
                    sha256=sha,
                    bytes=record.get("bytes"),
                    file=_file_of(f.url),
                )
            )
            continue
        if earlier is None:
            first[sha] = f
            kept.append(f.order)
    return kept


def _file_results(
    files: list[LakeFile],
    records: dict[int, tuple[str, dict]],
    kept: list[int],
    ids: dict[int, int],
    skipped: list[FileResult],
) -> list[FileResult]:
    """Each file that loaded, and each one skipped for holding an earlier file's bytes, as a
    local ingest reports them."""
    from forensics.ingest import FileResult

    out: list[FileResult] = []
    by_sha: dict[str, FileResult] = {}
    for f in files:
        part, r = records.get(f.order, ("failure", {}))
        if part != "evidence":
            continue
        if f.order in ids:
            done = FileResult(
                f.label,
                r["sha256"],
                r["bytes"],
                f.kind,
                r["format"],
                r["rows_read"],
                r["rows_loaded"],
                r["rows_rejected"],
                _instant(r["first_at"]),
                _instant(r["last_at"]),
                skipped=False,
                evidence_id=ids[f.order],
                outcome=r["outcome"],
                problem=r["problem"],
                rows_lost=r["rows_lost"],
                duplicates=r["duplicates"],
                conflicts=r["conflicts"],
            )
            by_sha[r["sha256"]] = done
            out.append(done)
        elif r["sha256"] in by_sha and by_sha[r["sha256"]].kind == f.kind:
            out.append(replace(by_sha[r["sha256"]], path=f.label, skipped=True))
    return out + skipped


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _stage_table(ws: Any, kind: str, rows: DataFrame | None, ids: dict[int, int]) -> None:
    """The workspace's evidence table ``kind``: its rows under their final evidence ids, each
    with a row id (an empty table when no file of the kind loaded).

    A view over what the reading tasks wrote, not a second copy of it: the final ids come
    from a map literal of one entry a file, so each scan is the Parquet read, a filter and a
    projection."""
    from itertools import chain

    from pyspark.sql import functions as F

    from forensics.dialect import ROWID

    session = ws.session
    columns = [name for name, _ in table_columns(kind)]
    schema = ", ".join(f"`{name}` {_SPARK_TYPES[dtype]}" for name, dtype in table_columns(kind))
    if rows is None or not ids:
        frame = session.createDataFrame([], schema)
    else:
        final = F.create_map(*chain.from_iterable((F.lit(o), F.lit(i)) for o, i in ids.items()))
        frame = rows.withColumn("evidence_id", final[F.col("evidence_id")].cast("int")).select(
            *columns
        )
    frame = frame.select(
        (F.col("evidence_id").cast("bigint") * F.lit(1 << ROW_BITS) + F.col("source_row")).alias(
            ROWID
        ),
        *columns,
    )
    ws.register_dataframe(kind, frame)


def _write_case_database(
    con: duckdb.DuckDBPyConnection,
    case: Case,
    ws: Any,
    files: list[LakeFile],
    records: dict[int, tuple[str, dict]],
    kept: list[int],
    ids: dict[int, int],
    rejects: dict[str, DataFrame],
    result: IngestResult,
) -> list[str]:
    """Replace the case database's evidence with what was read in place: the small kinds'
    rows, every file's evidence row, every reject, the failures, and ``evidence_in_place``.
    Returns a line for each file whose bytes differ from the previous read of its path."""
    import pyarrow as pa

    from forensics.ingest import clear_evidence, record_failures
    from forensics.sparkerrors import arrow_pieces, to_arrow

    before = dict(con.execute("SELECT path, sha256 FROM evidence").fetchall())
    by_order = {f.order: f for f in files}
    con.execute("BEGIN TRANSACTION")
    try:
        clear_evidence(con)
        for order in kept:
            f, (_, r) = by_order[order], records[order]
            con.execute(
                "INSERT INTO evidence (evidence_id, path, sha256, bytes, kind, format, rows_read, "
                "rows_loaded, rows_rejected, first_at, last_at, loaded_at, outcome, problem, "
                "rows_lost) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp, ?, ?, ?)",
                [
                    ids[order],
                    f.label,
                    r["sha256"],
                    r["bytes"],
                    f.kind,
                    r["format"],
                    r["rows_read"],
                    r["rows_loaded"],
                    r["rows_rejected"],
                    _instant(r["first_at"]),
                    _instant(r["last_at"]),
                    r["outcome"],
                    r["problem"],
                    r["rows_lost"],
                ],
            )
        labels = {order: by_order[order].label for order in kept}
        for kind, frame in rejects.items():
            table = pa.concat_tables(
                arrow_pieces(
                    frame.select(
                        "evidence_id", "source_row", "__kv_column", "__kv_reason", "__kv_raw"
                    ),
                    f"copying the rejects of {kind}",
                )
            )
            if not table.num_rows:
                continue
            con.register("__lake_rejects", table)
            con.register(
                "__lake_ids",
                _ids_table(ids, labels),
            )
            con.execute(
                "INSERT INTO rejects SELECT i.final, i.path, r.source_row, r.__kv_column, "
                "r.__kv_reason, r.__kv_raw FROM __lake_rejects r "
                "JOIN __lake_ids i ON i.order_ = r.evidence_id ORDER BY i.final, r.source_row"
            )
            con.unregister("__lake_rejects")
            con.unregister("__lake_ids")
        for kind in SMALL_KINDS:
            table = to_arrow(ws.session.table(kind), f"copying {kind}")
            columns = [name for name, _ in table_columns(kind)]
            con.register("__lake_small", table.select(columns))
            names = ", ".join(f'"{c}"' for c in columns)
            con.execute(f"INSERT INTO {kind} ({names}) SELECT {names} FROM __lake_small")
            con.unregister("__lake_small")
        for kind in LARGE_KINDS:
            loaded = sum(records[o][1]["rows_loaded"] for o in kept if by_order[o].kind == kind)
            con.execute(
                "INSERT INTO evidence_in_place VALUES (?, ?, current_timestamp, ?)",
                [kind, loaded, case.engine.master],
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    record_failures(con, "manifest", result.failures)
    changed = []
    for order in kept:
        f, sha = by_order[order], records[order][1]["sha256"]
        old = before.get(f.label)
        if old is not None and old != sha:
            changed.append(
                f"{f.label}: its bytes changed since the previous read (sha256 {old[:12]} -> "
                f"{sha[:12]}): the findings now rest on the new bytes"
            )
    return changed


def _ids_table(ids: dict[int, int], labels: dict[int, str]) -> pa.Table:
    import pyarrow as pa

    orders = list(ids)
    return pa.table(
        {
            "order_": pa.array(orders, pa.int32()),
            "final": pa.array([ids[o] for o in orders], pa.int32()),
            "path": pa.array([labels[o] for o in orders], pa.string()),
        }
    )


def copy_extract(ws: Any, con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Copy into the case database the evidence rows behind the findings: every request a
    finding names (flagged, a recipient or a source of an exposure) and the engine legs that
    belong to them (by request id or PD bootstrap room), so that ``forensics explain`` tells
    their story from the case database. Returns the rows copied per table.

    The database then holds those rows only; ``evidence_in_place`` still says how many lie
    where they were read, and detection still refuses to run on what is here.
    """
    import pyarrow as pa
    from pyspark.sql import functions as F

    from forensics.sparkerrors import arrow_pieces

    session = ws.session
    named = (
        session.table("findings_affected")
        .select(F.col("request_id"))
        .unionByName(session.table("findings_signals").select("request_id"))
        .unionByName(
            session.table("findings_exposures").select(
                F.col("recipient_request_id").alias("request_id")
            )
        )
        .unionByName(
            session.table("findings_exposures").select(
                F.col("source_request_id").alias("request_id")
            )
        )
        .where(F.col("request_id").isNotNull())
        .distinct()
    )
    requests = session.table("requests").join(named, "request_id", "left_semi")
    rooms = requests.select("bootstrap_room").where(F.col("bootstrap_room").isNotNull()).distinct()
    legs = session.table("engine_legs")
    legs = legs.join(named, "request_id", "left_semi").unionByName(
        legs.join(rooms, "bootstrap_room", "left_semi")
    )
    copied = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for kind, frame in (("requests", requests), ("engine_legs", legs.distinct())):
            columns = [name for name, _ in table_columns(kind)]
            what = f"copying the {kind} behind the findings"
            table = pa.concat_tables(arrow_pieces(frame.select(*columns), what))
            con.execute(f"DELETE FROM {kind}")
            con.register("__lake_extract", table)
            names = ", ".join(f'"{c}"' for c in columns)
            con.execute(
                f"INSERT INTO {kind} ({names}) SELECT {names} FROM __lake_extract "
                "ORDER BY evidence_id, source_row"
            )
            con.unregister("__lake_extract")
            copied[kind] = table.num_rows
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return copied
