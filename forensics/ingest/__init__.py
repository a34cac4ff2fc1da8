"""Canonical ingest: evidence files into the typed tables of a case database.

One file loads in one transaction (:mod:`forensics.ingest.file`); a run of canonical Parquet
files with the same columns, or of canonical JSON Lines files, loads in one transaction and one
statement, which DuckDB reads file-parallel (:mod:`forensics.ingest.batch`). Every source
value is read as text (or as its Parquet physical type) and cast to its canonical type by a
single vectorised DuckDB query; rows with a missing required value or a value that does not
cast go to ``rejects`` with a reason a responder can act on, never silently dropped. Each
file gets one ``evidence`` row with its sha256, so a file already loaded is recognised and
skipped.

No evidence goes missing unnoticed: a damaged compressed file loads the rows before its damage
and is recorded as ``partial`` with what was lost; a file that cannot be loaded at all, and a
manifest pattern that matches no file, are recorded in ``evidence_failures``.
:func:`evidence_outcomes` reads both back. This module holds the many-file side: a case's
[[evidence]] entries or a list of paths, their failures, and the case's evidence records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics import schema
from forensics.errors import ForensicsError, ResourceError
from forensics.ingest import batch
from forensics.ingest.batch import Batchable, HashesAhead, Job
from forensics.ingest.file import (
    SUPPORTED_FORMATS,
    Progress,
    check_format,
    check_kind,
    check_timezone,
    column_names,
    file_sha256,
    ingest_file,
)
from forensics.ingest.results import FileFailure, FileResult, IngestResult
from forensics.status import (  # re-exported: the status API belongs to ingest's public face
    EvidenceOutcome,
    EvidenceRow,
    KindSpan,
    RejectGroup,
    StatusReport,
    evidence_outcomes,
    evidence_status,
)

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case

__all__ = [
    "SUPPORTED_FORMATS",
    "EvidenceOutcome",
    "EvidenceRow",
    "FileFailure",
    "FileResult",
    "IngestResult",
    "KindSpan",
    "Progress",
    "RejectGroup",
    "StatusReport",
    "check_format",
    "check_kind",
    "check_timezone",
    "evidence_outcomes",
    "evidence_status",
    "file_sha256",
    "ingest_case",
    "ingest_file",
    "ingest_paths",
]


def file_label(path: Path, folder: Path) -> str:
    """A path relative to the case folder when it lies inside it (portable, stable)."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(path)


def entry_defaults(kind: str, entry: Any) -> dict[str, Any]:
    names = column_names(kind)
    given = {"node": entry.node, "role": entry.role, "observed_at": entry.observed_at}
    return {k: v for k, v in given.items() if v is not None and k in names}


def rows_in(path: Path) -> int | None:
    """How many rows a file says it holds without reading them (a Parquet footer), else None."""
    from forensics.readers import detect_type

    try:
        if detect_type(path) != ("parquet", None):
            return None
        import pyarrow.parquet as pq

        return pq.read_metadata(path).num_rows
    except Exception:  # noqa: BLE001 - a damaged footer just means the count is unknown
        return None


def _load_all(
    con: duckdb.DuckDBPyConnection,
    jobs: Iterable[Job],
    result: IngestResult,
    progress: Progress | None,
    entry: int | None = None,
) -> None:
    """Load ``jobs`` in order: runs of canonical Parquet files with the same columns, and of
    canonical JSON Lines files, together (:func:`batch.load_batch`), every other file on its own
    (:func:`ingest_file`)."""
    pending: list[Batchable] = []
    jobs = list(jobs)
    hashes = HashesAhead([job[0] for job in jobs if job[2] == "canonical"])

    def load(items: list[Batchable], again: bool) -> None:
        # One Parquet file gains nothing from a batch; one JSON Lines file gains DuckDB's reader.
        if len(items) > 1 or (items and items[0].file_type == "jsonl"):
            loaded, alone = batch.load_batch(con, items, progress)
            if loaded is not None:
                for item, done in zip(items, loaded, strict=True):
                    _loaded(con, result, done, item.job[0])
                return
            if again and alone:
                # The files only the line reader reads load alone, the runs between them
                # together once more, all in their order (which of two repeats is the older
                # depends on it).
                run: list[Batchable] = []
                for i, item in enumerate(items):
                    if i in alone:
                        load(run, again=False)
                        run = []
                        _load_one(con, item.job, result, progress, entry)
                    else:
                        run.append(item)
                load(run, again=False)
                return
        for item in items:
            _load_one(con, item.job, result, progress, entry)

    def flush() -> None:
        load(list(pending), again=True)
        pending.clear()

    try:
        for job in jobs:
            item = batch.batchable(con, job, hashes)
            if pending and (
                item is None
                or item.key != pending[0].key
                or item.sha in {p.sha for p in pending}
                or sum(p.size for p in pending) + item.size > batch.BATCH_BYTES
            ):
                flush()
            if item is not None:
                pending.append(item)
            else:
                _load_one(con, job, result, progress, entry)
        flush()
    finally:
        hashes.close()


def _loaded(
    con: duckdb.DuckDBPyConnection, result: IngestResult, done: FileResult, path: Path
) -> None:
    result.files.append(done)
    # The file is in the database now: a failure recorded for it earlier is history.
    con.execute("DELETE FROM evidence_failures WHERE file = ?", [str(path.resolve())])


def _load_one(
    con: duckdb.DuckDBPyConnection,
    job: Job,
    result: IngestResult,
    progress: Progress | None,
    entry: int | None,
) -> None:
    path, kind, fmt, tz, defaults, label, tenant_field = job
    try:
        done = ingest_file(
            con,
            path,
            kind,
            fmt,
            timezone=tz,
            defaults=defaults,
            progress=progress,
            label=label,
            tenant_field=tenant_field,
        )
    except ResourceError:
        # Not the file's fault: recording it as failed evidence would be wrong, and the
        # next file would fail the same way.
        raise
    except ForensicsError as exc:
        result.failures.append(
            FileFailure(
                label,
                kind,
                failure_message(exc, label),
                format=fmt,
                entry=entry,
                sha256=getattr(exc, "sha256", None),
                bytes=getattr(exc, "bytes", None),
                rows_lost=rows_in(path),
                file=str(path.resolve()),
            )
        )
    else:
        _loaded(con, result, done, path)


def failure_message(exc: Exception, label: str) -> str:
    """What a file's failure says, without its name: one printable line (a decoder may quote
    the damaged bytes)."""
    message = str(exc).removeprefix(f"{label}: ")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


@contextmanager
def _few_checkpoints(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Checkpoint every 256 MB of log while loading, and once at the end.

    Each file commits on its own, and by default DuckDB checkpoints whenever its log passes
    16 MB: after nearly every file, and those checkpoints cost more than the inserts (60 % of
    a Parquet ingest at 1M requests). The log keeps every commit durable in between.
    """
    con.execute("SET checkpoint_threshold = '256MB'")
    try:
        yield
    finally:
        con.execute("RESET checkpoint_threshold")
    con.execute("CHECKPOINT")


def record_failures(
    con: duckdb.DuckDBPyConnection,
    source: str,
    failures: list[FileFailure],
    paths: Iterable[str] | None = None,
) -> None:
    """Store ``failures`` as the current ones of ``source`` in ``evidence_failures``.

    With ``paths`` None every earlier row of ``source`` is replaced (a manifest ingest states
    the whole manifest); otherwise only the rows of those paths are (loading files by name
    speaks only for the files it was given).
    """
    con.execute("BEGIN TRANSACTION")
    try:
        if paths is None:
            con.execute("DELETE FROM evidence_failures WHERE source = ?", [source])
        else:
            for path in dict.fromkeys(paths):
                con.execute(
                    "DELETE FROM evidence_failures WHERE source = ? AND path = ?", [source, path]
                )
        if failures:
            con.executemany(
                "INSERT INTO evidence_failures (source, entry, path, file, kind, format, outcome, "
                "reason, sha256, bytes, rows_lost) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        source,
                        f.entry,
                        f.path,
                        f.file,
                        f.kind,
                        f.format,
                        f.outcome,
                        f.message,
                        f.sha256,
                        f.bytes,
                        f.rows_lost,
                    )
                    for f in failures
                ],
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def evidence_in_place(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The kinds whose rows the last read of this case left where they lie (read in place by
    Spark: :mod:`forensics.lake`), with how many rows each holds there; empty when the
    evidence is in the case database."""
    return dict(con.execute("SELECT kind, rows_loaded FROM evidence_in_place").fetchall())


def refused_in_place(kinds: dict[str, int]) -> str:
    """Why a detection that does not read in place refuses a case whose evidence was read in
    place: the case database holds none of its requests, and would be found clean.

    >>> print(refused_in_place({"requests": 1200, "engine_legs": 2400, "kv_allocations": 0}))
    the evidence of this case was read in place by Spark (1,200 requests and 2,400
    engine_legs where they lie, none in the case database): detect it in place again
    (--engine spark --in-place, or [engine] evidence = "in-place"), or load it here with
    forensics ingest first
    """
    held = " and ".join(f"{n:,} {k}" for k, n in kinds.items() if n) or "its rows"
    return (
        f"the evidence of this case was read in place by Spark ({held} where they lie, none "
        "in the case database): detect it in place again (--engine spark --in-place, or "
        '[engine] evidence = "in-place"), or load it here with forensics ingest first'
    )


def clear_evidence(con: duckdb.DuckDBPyConnection) -> None:
    """Empty every evidence table of the case database and its bookkeeping but the failures
    (whoever records those replaces them), inside the caller's transaction."""
    for kind in schema.KINDS:
        con.execute(f"DELETE FROM {kind}")
    con.execute("DELETE FROM rejects")
    con.execute("DELETE FROM evidence")
    con.execute("DELETE FROM evidence_in_place")


def _leave_in_place(con: duckdb.DuckDBPyConnection) -> None:
    """Before loading files into a case whose evidence was read in place: its records say
    what lies elsewhere, not what this database holds, so they go (a file they list would
    otherwise count as loaded already)."""
    if not evidence_in_place(con):
        return
    con.execute("BEGIN TRANSACTION")
    try:
        clear_evidence(con)
        con.execute("DELETE FROM evidence_failures")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def ingest_case(case: Case, progress: Progress | None = None) -> IngestResult:
    """Load every file of every [[evidence]] entry of a case into ``case.database``.

    A file that cannot be loaded at all (missing, unreadable, not the format its name says) is
    recorded in ``IngestResult.failures`` and the other files still load; so is each pattern
    that matches nothing, since missing evidence must not pass unnoticed. A damaged compressed
    file loads the rows before its damage and is ``partial``. The failures are stored in
    ``evidence_failures`` as the manifest's current state: one fixed since the last ingest
    disappears, and a file already loaded keeps the outcome recorded when it was loaded.
    """
    from forensics.case import is_uri
    from forensics.db import connect

    for i, entry in enumerate(case.evidence, start=1):
        for pattern in entry.paths:
            if is_uri(pattern):
                raise ForensicsError(
                    f"[[evidence]] #{i}: {pattern} is a URI, which only Spark reads, where it "
                    'lies: set [engine] name = "spark" and evidence = "in-place" (or pass '
                    "--engine spark --in-place to run or detect)"
                )
    result = IngestResult()
    con = connect(case.database, memory_limit=case.memory_limit)
    try:
        _leave_in_place(con)
        with _few_checkpoints(con):
            for i, entry in enumerate(case.evidence, start=1):
                files: list[Path] = []
                # Pattern by pattern: one that matches nothing is missing evidence even when the
                # entry's other patterns match.
                for pattern in entry.paths:
                    found = replace(entry, paths=(pattern,)).files()
                    if not found:
                        result.failures.append(
                            FileFailure(
                                file_label(Path(pattern), case.folder),
                                entry.kind,
                                f"no file matches this pattern ([[evidence]] #{i},"
                                f" kind {entry.kind})",
                                format=entry.format,
                                entry=i,
                                outcome="missing",
                            )
                        )
                    files += found
                defaults = entry_defaults(entry.kind, entry)
                jobs = [
                    (
                        f,
                        entry.kind,
                        entry.format,
                        case.timezone,
                        defaults,
                        file_label(f, case.folder),
                        entry.tenant_field,
                    )
                    for f in dict.fromkeys(files)
                ]
                _load_all(con, jobs, result, progress, entry=i)
        record_failures(con, "manifest", result.failures)
    finally:
        con.close()
    return result


def ingest_paths(
    db_path: str | Path,
    paths: Iterable[str | Path],
    kind: str,
    fmt: str = "canonical",
    timezone: str = "UTC",
    progress: Progress | None = None,
    memory_limit: str | None = None,
    node: str | None = None,
    role: str | None = None,
    tenant_field: str | None = None,
) -> IngestResult:
    """Load files (or globs) of one kind into the case database at ``db_path``.

    Failures (files that could not be loaded, patterns that matched nothing) are returned and
    stored in ``evidence_failures``, replacing what was recorded before for the same paths.
    ``memory_limit`` caps DuckDB's memory (see :func:`forensics.db.connect`). ``node``,
    ``role`` and ``tenant_field`` say what an [[evidence]] entry's keys of those names say.

    Raises:
        ForensicsError: a bad kind, format name or time zone (before anything is loaded).
    """
    from forensics.case import Evidence
    from forensics.db import connect

    check_kind(kind)
    check_timezone(timezone)
    check_format(fmt)
    from forensics.adapters import check_entry

    problem = check_entry(fmt, kind, tenant_field)
    if problem:
        raise ForensicsError(problem)
    given = {"node": node, "role": role}
    defaults = {k: v for k, v in given.items() if v is not None and k in column_names(kind)}
    result = IngestResult()
    files: list[Path] = []
    for pattern in (str(p) for p in paths):
        found = Evidence(kind=kind, format=fmt, paths=(pattern,)).files()
        if not found:
            result.failures.append(
                FileFailure(
                    pattern, kind, "no file matches this pattern", format=fmt, outcome="missing"
                )
            )
        files += found
    files = list(dict.fromkeys(files))
    con = connect(db_path, memory_limit=memory_limit)
    try:
        _leave_in_place(con)
        jobs = [(f, kind, fmt, timezone, defaults, str(f), tenant_field) for f in files]
        with _few_checkpoints(con):
            _load_all(con, jobs, result, progress)
        tried = [str(f) for f in files] + [f.path for f in result.failures]
        record_failures(con, "files", result.failures, tried)
    finally:
        con.close()
    return result
