"""Several canonical evidence files loaded by one statement, which DuckDB reads file-parallel,
in one transaction; each file still gets its own evidence row, rejects and repeat check
(:func:`forensics.ingest.file.finish`). When anything in a batch fails it is undone and its
files load one by one (:func:`forensics.ingest.ingest_file`), so a failure is charged to its
own file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics import repeats
from forensics.casts import stage_sql
from forensics.errors import EvidenceError
from forensics.ingest.file import (
    LinesNeeded,
    Progress,
    Staged,
    check_canonical,
    column_names,
    existing,
    file_sha256,
    finish,
    insert_good,
    open_file,
    runner,
    tag_numbers,
    watch_query,
    with_tenant_field,
)
from forensics.ingest.results import FileResult
from forensics.readers import Source, sql_str
from forensics.sql import scalar

if TYPE_CHECKING:
    import duckdb


# A job: (path, kind, format, time zone, defaults, label, tenant_field).
Job = tuple[Path, str, str, str, dict[str, Any], str, str | None]

# Canonical Parquet and JSON Lines files of one entry load in one statement, up to this many
# bytes: DuckDB reads the files of one statement in parallel, but a Parquet file of one row
# group or a compressed file on one thread (a 1M-request case's daily Parquet files loaded in
# half the time together).
BATCH_BYTES = 1 << 30
# Virtual columns the batched read relies on; a file with a real column of such a name loads
# on its own.
_VIRTUAL = frozenset({"file_index", "file_row_number", "filename"})


@dataclass
class Batchable:
    job: Job
    sha: str
    size: int
    key: tuple  # what files must share to load together: kind, zone, defaults, file type...
    file_type: str  # parquet | jsonl
    compression: str | None


class HashesAhead:
    """The sha256 of the files about to load, read in a thread a little ahead of the load.

    Hashing reads a file whole, and ingest reads it again to load it: done in turn, the two
    reads added up (2 s of an 8M-request ingest). hashlib works outside the GIL, so the next
    files are hashed while the database loads the ones before them, which then come to it
    from the page cache. At most ``BATCH_BYTES`` are hashed beyond the file asked for.
    """

    def __init__(self, paths: list[Path]):
        from concurrent.futures import ThreadPoolExecutor

        self._paths = paths
        self._sizes = [_size(path) for path in paths]
        self._futures: dict[int, Any] = {}
        self._asked = 0  # files before it were asked for, or passed over
        self._next = 0  # files before it were handed to the thread
        self._pool = ThreadPoolExecutor(max_workers=1)

    def get(self, path: Path) -> tuple[str, int]:
        """The file's sha256 and size, as :func:`file_sha256` gives them (and raises)."""
        try:
            k = self._paths.index(path, self._asked)
        except ValueError:
            return file_sha256(path)
        for passed in range(self._asked, k):
            self._futures.pop(passed, None)
        self._asked = k + 1
        ahead = sum(self._sizes[k + 1 : self._next])
        while self._next < len(self._paths) and (self._next <= k or ahead < BATCH_BYTES):
            i = self._next
            self._futures[i] = self._pool.submit(file_sha256, self._paths[i])
            if i > k:
                ahead += self._sizes[i]
            self._next += 1
        return self._futures.pop(k).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def batchable(con: duckdb.DuckDBPyConnection, job: Job, hashes: HashesAhead) -> Batchable | None:
    """The job as a candidate for a batched load, or None when it must load on its own: not
    canonical uncompressed Parquet or canonical JSON Lines (plain or gzip), a path DuckDB would
    take for a pattern, unreadable, already loaded (ingest_file says so), or holding a column
    named like a virtual one."""
    import duckdb

    from forensics.readers import detect_type, globs

    path, kind, fmt, tz, defaults, _, tenant_field = job
    if fmt != "canonical" or globs(path):
        return None
    try:
        file_type, compression = detect_type(path)
        if (file_type, compression) not in (("parquet", None), ("jsonl", None), ("jsonl", "gzip")):
            return None
        sha, size = hashes.get(path)
    except (OSError, EvidenceError):
        return None
    if existing(con, sha) is not None:
        return None
    key = (kind, tz, tuple(sorted((k, str(v)) for k, v in defaults.items())), tenant_field)
    if file_type == "jsonl":
        # Their keys are read when the batch loads (readers.json_lines_natively).
        return Batchable(job, sha, size, (*key, file_type, compression), file_type, compression)
    try:
        columns = tuple(
            (r[0], r[1])
            for r in con.execute(
                f"DESCRIBE SELECT * FROM read_parquet({sql_str(str(path))})"
            ).fetchall()
        )
    except duckdb.Error:
        return None
    if any(name in _VIRTUAL for name, _ in columns):
        return None
    return Batchable(job, sha, size, key + columns, file_type, compression)


def load_batch(
    con: duckdb.DuckDBPyConnection, batch: list[Batchable], progress: Progress | None
) -> tuple[list[FileResult] | None, list[int]]:
    """Load several canonical Parquet files of the same columns, or canonical JSON Lines files
    that DuckDB's JSON reader reads exactly (:func:`~forensics.readers.json_lines_natively`),
    in one transaction, their good rows by one statement; then each file's duplicates, rejects
    and evidence row as a single file's (:func:`finish`).

    Returns:
        The files' results; or None, with nothing written, when anything failed, and the
        positions of the JSON Lines files that only the line reader reads as it should
        (declined by DuckDB's reader, or holding a reject). The caller then loads those alone
        and tries the others again, or loads every file alone, where a failure is charged to
        its own file.
    """
    import duckdb

    from forensics.readers import json_lines_natively

    _, kind, _, tz, defaults, _, field_ = batch[0].job
    sizes = [item.size for item in batch]
    labels = [item.job[5] for item in batch]

    reached = [0]  # the files the bar has shown, in order (progress numbers them as seen)

    def report(fraction: float) -> None:
        # The files are read together; the bar walks them in order.
        if progress:
            k = min(len(batch) - 1, int(fraction * len(batch)))
            for j in range(reached[0], k):
                progress(labels[j], sizes[j], sizes[j])
            reached[0] = max(reached[0], k)
            progress(labels[k], int(sizes[k] * (fraction * len(batch) - k)), sizes[k])

    report(0.0)
    con.execute("SET enable_progress_bar_print = false")
    sources: list[Source] = []
    paths = [item.job[0] for item in batch]
    # JSON Lines files are read twice, to check them and to copy their rows to a temp table,
    # which is then loaded: a third of the bar each.
    first, rest = (2 / 3, 1 / 3) if batch[0].file_type == "jsonl" else (0.0, 1.0)
    if batch[0].file_type == "jsonl":
        staged_rows = f"__kv_native_{next(tag_numbers)}"
        # Outside the transaction: a file DuckDB's reader fails on would abort it.
        stopper = watch_query(con, lambda f: report(f / 3)) if progress else None
        try:
            check_canonical(kind, field_)
            # A key outside the schema (a tenant_field among them) goes to a row's extra
            # column, which the line reader builds: such files are read by it.
            native = json_lines_natively(con, paths, batch[0].compression, column_names(kind))
            if native.declined:
                return None, native.declined
            sources = [with_tenant_field(source, field_) for source in native.sources]
        except EvidenceError:
            return None, []
        finally:
            if stopper:
                stopper()
        stopper = watch_query(con, lambda f: report((1 + f) / 3)) if progress else None
        try:
            con.execute(f"CREATE TEMP TABLE {staged_rows} AS {native.read}")
        except duckdb.Error:
            con.execute(f"DROP TABLE IF EXISTS {staged_rows}")
            return None, []
        finally:
            if stopper:
                stopper()
        sources[0].cleanup.append(staged_rows)  # dropped with the sources, whatever happens
    con.execute("BEGIN TRANSACTION")
    try:
        tags = [str(next(tag_numbers)) for _ in batch]
        if batch[0].file_type == "jsonl":
            relation, position, row = native.numbered(staged_rows), "__kv_file_no", "__kv_row"
        else:
            for path, tag in zip(paths, tags, strict=True):
                sources.append(
                    open_file(con, path, kind, "canonical", tag, None, defaults, field_)[0]
                )
            files = ", ".join(sql_str(str(path)) for path in paths)
            relation = f"read_parquet([{files}])"
            position, row = "file_index::BIGINT + 1", "file_row_number + 1"
        eids = [scalar(con, "SELECT nextval('evidence_seq')") for _ in batch]
        ids = ", ".join(str(e) for e in eids)
        together = replace(
            sources[0],
            relation=(
                f"(SELECT *, list_extract([{ids}]::BIGINT[], {position}) AS __kv_eid, "
                f"{row} AS __kv_fr FROM {relation})"
            ),
            row_expr="__kv_fr",
            cleanup=[],
            temp_files=[],
        )
        sql, names = stage_sql(kind, together, tz, defaults, keep=("__kv_eid",))
        statement = insert_good(kind, sql, names, "__kv_eid")
        stopper = watch_query(con, lambda f: report(first + rest * f)) if progress else None
        try:
            con.execute(statement)
        finally:
            if stopper:
                stopper()
        counts = dict(
            con.execute(
                f"SELECT evidence_id, count(*) FROM {kind} WHERE evidence_id IN ({ids}) "
                "GROUP BY evidence_id"
            ).fetchall()
        )
        short = [
            i
            for i, (source, eid) in enumerate(zip(sources, eids, strict=True))
            if source.redo_for_rejects and counts.get(eid, 0) != source.rows
        ]
        if short:
            raise LinesNeeded(short)
        # One look for the whole batch; only when it may hold a repeat does each file take
        # the exact check (which scans everything loaded before it, file after file).
        may_repeat = repeats.may_repeat(con, kind, eids)
        results = []
        for i, (item, source, tag, eid) in enumerate(zip(batch, sources, tags, eids, strict=True)):
            staged = Staged(
                kind,
                "canonical",
                item.job[5],
                item.sha,
                item.size,
                source,
                tag,
                tz,
                defaults,
                check_duplicates=may_repeat,
            )
            run = runner(con, item.size, lambda d, t: None, False)
            try:
                results.append(finish(con, staged, eid, counts.get(eid, 0), run))
            except LinesNeeded:
                raise LinesNeeded([i]) from None  # a repeat of a row loaded before
        con.execute("COMMIT")
    except LinesNeeded as exc:
        con.execute("ROLLBACK")
        return None, exc.positions
    except (duckdb.Error, EvidenceError):
        con.execute("ROLLBACK")
        return None, []
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        for source in sources:
            source.close(con)
    for label, size in zip(labels, sizes, strict=True):
        if progress:
            progress(label, size, size)
    return results, []
