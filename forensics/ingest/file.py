"""One evidence file into its canonical table, in one transaction: its good rows, its rejects
with their reasons, the rows that repeat an event already loaded, and its ``evidence`` row.

:mod:`forensics.ingest.batch` loads several canonical files with one statement and then
finishes each of them here, as a single file's (:func:`finish`).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forensics import repeats, schema
from forensics.casts import _SEP, stage_sql
from forensics.errors import EvidenceError, ForensicsError
from forensics.ingest.results import FileResult
from forensics.progress import StepProgress
from forensics.readers import Source, open_source, sql_ident, sql_str
from forensics.sql import first_row, scalar
from forensics.status import EXACT_DUPLICATE

if TYPE_CHECKING:
    import duckdb

# progress(file label, bytes done, bytes total): called as a file is read and loaded.
Progress = StepProgress

SUPPORTED_FORMATS = ("canonical", "sglang", "otel", "litellm", "cloudflare", "auto")
# Tags name a load's working tables, unique within the process.
tag_numbers = itertools.count(1)


# --- validation helpers ---------------------------------------------------------------------


def check_kind(kind: str) -> None:
    """Raise ForensicsError unless ``kind`` is a canonical evidence kind."""
    if kind not in schema.KINDS:
        raise ForensicsError(
            f"unknown evidence kind {kind!r} (expected one of: {', '.join(schema.KINDS)})"
        )


def check_timezone(tz: str) -> None:
    """Raise ForensicsError unless ``tz`` is an IANA time zone name."""
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ForensicsError(f"unknown time zone {tz!r} (use an IANA name such as UTC)") from None


def check_format(fmt: str) -> str:
    """``fmt`` itself when ingest reads it (``auto`` is resolved per file, by its content)."""
    from forensics.case import FORMATS

    if fmt not in FORMATS:
        raise ForensicsError(f"unknown format {fmt!r} (expected one of: {', '.join(FORMATS)})")
    if fmt not in SUPPORTED_FORMATS:
        raise EvidenceError(f"format {fmt!r} is not supported yet")
    return fmt


def file_sha256(path: Path) -> tuple[str, int]:
    """The sha256 (hex) and size in bytes of a file, read in 8 MiB blocks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


# --- one file -------------------------------------------------------------------------------


def existing(con: duckdb.DuckDBPyConnection, sha: str) -> tuple | None:
    return con.execute(
        "SELECT evidence_id, path, bytes, kind, format, rows_read, rows_loaded, rows_rejected, "
        "first_at, last_at, outcome, problem, rows_lost FROM evidence WHERE sha256 = ?",
        [sha],
    ).fetchone()


def watch_query(con: duckdb.DuckDBPyConnection, report: Callable[[float], None]):
    """Poll DuckDB's progress of the running query from a helper thread; returns a stopper."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.25):
            try:
                pct = con.query_progress()
            except Exception:  # noqa: BLE001 - progress is cosmetic; never fail a load for it
                return
            if pct is not None and pct >= 0:
                report(min(pct, 100.0) / 100.0)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()

    def stopper() -> None:
        stop.set()
        thread.join()

    return stopper


def ingest_file(
    con: duckdb.DuckDBPyConnection,
    path: str | Path,
    kind: str,
    fmt: str = "canonical",
    *,
    timezone: str = "UTC",
    defaults: dict[str, Any] | None = None,
    progress: Progress | None = None,
    label: str | None = None,
    tenant_field: str | None = None,
    check_duplicates: bool = True,
    flags: Sequence[tuple[int, str | None, str]] | None = None,
) -> FileResult:
    """Load one evidence file into its canonical table, in one transaction.

    Args:
        con: an open case database (see :func:`forensics.db.connect`).
        path: the file; its extension decides the reader (.jsonl/.ndjson/.json, .csv,
            .parquet, each optionally .gz or .zst).
        kind: the canonical table (requests, engine_legs, pool_snapshots, ...).
        fmt: ``canonical``, an adapter format (``sglang``, ``otel``, ``litellm``: see
            :mod:`forensics.adapters`) or ``auto``, which picks one from the file's first
            bytes; the format read is recorded in ``evidence.format``.
        timezone: the zone of timestamps that carry no offset.
        defaults: column -> value for columns the file lacks (an [[evidence]] entry's node,
            role or observed_at).
        progress: called with (label, bytes done, bytes total) while the file loads.
        label: the name recorded in ``evidence.path`` and in messages (default: ``path``).
        tenant_field: the field holding the tenant, where it is not the format's default.
        check_duplicates: find the rows that repeat an event already loaded (or an earlier
            row of the file) and reject them; off where the caller judges repeats across
            every file at once (evidence read in place: :mod:`forensics.lake`).
        flags: ``(source_row, column, reason)`` of rows to reject with that reason instead
            (the repeats such a caller found); they must be rows that load.

    Returns:
        The file's result; ``skipped`` is True when a file with the same sha256 was already
        loaded (nothing is written then). A damaged compressed JSON Lines or CSV file loads
        the rows before the damage, with outcome ``partial``; a complete load of a path that
        was loaded partially before replaces that partial load (``replaced``).

    Raises:
        EvidenceError: the whole file could not be loaded (the message starts with its name);
            nothing of it is kept.
        ForensicsError: a bad kind, format or time zone.
    """
    import duckdb

    path = Path(path)
    label = label or str(path)
    check_kind(kind)
    check_timezone(timezone)
    try:
        fmt_name = check_format(fmt)
    except EvidenceError as exc:
        raise EvidenceError(f"{label}: {exc}") from None
    defaults = {k: v for k, v in (defaults or {}).items() if v is not None}
    sha, size = _fingerprint(path, label)
    seen = _already_loaded(con, label, sha, size, kind)
    if seen is not None:
        return seen

    def report(done: int, total: int) -> None:
        if progress:
            progress(label, done, total)

    report(0, size)
    # DuckDB would draw its own bar on the terminal; ours comes through ``progress``.
    con.execute("SET enable_progress_bar_print = false")
    tag = str(next(tag_numbers))
    source: Source | None = None
    con.execute("BEGIN TRANSACTION")
    try:
        try:
            # Reading is the first half of the work, casting and inserting the second.
            source, fmt_name = open_file(
                con,
                path,
                kind,
                fmt_name,
                tag,
                lambda d, t: report(d // 2, t),
                defaults,
                tenant_field,
            )
            staged = Staged(
                kind,
                fmt_name,
                label,
                sha,
                size,
                source,
                tag,
                timezone,
                defaults,
                check_duplicates=check_duplicates,
                flags=flags,
            )
            result = _load(con, staged, report, progress is not None)
        except duckdb.OutOfMemoryException as exc:
            from forensics.db import memory_error

            raise memory_error(exc, label) from None
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0]
            raise EvidenceError(f"cannot load the file ({first})") from None
        source.close(con)
        con.execute("COMMIT")
    except BaseException as exc:
        con.execute("ROLLBACK")
        if source is not None:
            source.close(con)
        if isinstance(exc, EvidenceError):
            error = exc if str(exc).startswith(f"{label}: ") else EvidenceError(f"{label}: {exc}")
            # Which file failed, exactly: its digest goes into the record of the failure.
            error.sha256, error.bytes = sha, size
            raise error from None
        raise
    report(size, size)
    return result


def _fingerprint(path: Path, label: str) -> tuple[str, int]:
    """The file's sha256 and size; a missing or unreadable file is an EvidenceError."""
    try:
        return file_sha256(path)
    except FileNotFoundError:
        raise EvidenceError(f"{label}: file not found") from None
    except OSError as exc:
        raise EvidenceError(f"{label}: cannot read the file ({exc.strerror or exc})") from None


def _already_loaded(
    con: duckdb.DuckDBPyConnection, label: str, sha: str, size: int, kind: str
) -> FileResult | None:
    """The result of an earlier load of the same bytes, if any: its outcome stands (a partial
    file stays partial until a complete copy of it is loaded). The same bytes as another kind
    are refused."""
    seen = existing(con, sha)
    if seen is None:
        return None
    if seen[3] != kind:
        error = EvidenceError(
            f"{label}: the same file (sha256 {sha[:12]}) is already loaded as kind "
            f"{seen[3]} from {seen[1]}"
        )
        error.sha256, error.bytes = sha, size
        raise error
    return FileResult(
        label,
        sha,
        seen[2],
        seen[3],
        seen[4],
        seen[5],
        seen[6],
        seen[7],
        seen[8],
        seen[9],
        skipped=True,
        evidence_id=seen[0],
        outcome=seen[10] or "loaded",
        problem=seen[11],
        rows_lost=seen[12],
    )


def open_file(
    con, path: Path, kind: str, fmt: str, tag: str, progress, defaults, tenant_field
) -> tuple[Source, str]:
    """The file as a source of canonical columns, read directly or through its adapter, and
    the format it was read in (``auto`` resolved)."""
    from forensics import adapters

    if fmt == "auto":
        fmt, _ = adapters.sniff(path)
    if fmt != "canonical":
        options = adapters.Options(
            node=defaults.get("node"),
            role=defaults.get("role"),
            observed_at=defaults.get("observed_at"),
            tenant_field=tenant_field,
        )
        source = adapters.open_source(con, path, kind, fmt, tag, progress, options)
    else:
        check_canonical(kind, tenant_field)
        source = with_tenant_field(open_source(con, path, tag, progress), tenant_field)
    return source, fmt


def check_canonical(kind: str, tenant_field: str | None) -> None:
    from forensics import adapters

    problem = adapters.check_entry("canonical", kind, tenant_field)
    if problem:
        raise EvidenceError(problem)


def with_tenant_field(source: Source, tenant_field: str | None) -> Source:
    if tenant_field is not None and not source.empty:
        # The tenant is in a column of another name: it stands for tenant_id.
        if tenant_field not in source.columns:
            raise EvidenceError(f"no column {tenant_field!r} (the entry's tenant_field)")
        source.columns["tenant_id"] = source.columns[tenant_field]
    return source


@dataclass
class Staged:
    """One evidence file opened as a source, with what its rows are loaded under."""

    kind: str
    fmt: str
    label: str
    sha: str
    size: int
    source: Source
    tag: str
    tz: str
    defaults: dict[str, Any]
    # Repeats of loaded events are found here, or given (``flags``), or not judged at all.
    check_duplicates: bool = True
    flags: Sequence[tuple[int, str | None, str]] | None = None

    def sql(self, flagged: str | None = None) -> str:
        """Its casting query (see :func:`stage_sql`); ``flagged`` rows rejected as well."""
        return stage_sql(self.kind, self.source, self.tz, self.defaults, flagged)[0]


def _load(
    con: duckdb.DuckDBPyConnection,
    staged: Staged,
    report: Callable[[int, int], None],
    watch: bool,
) -> FileResult:
    """Write good rows, then rejects, then the evidence row; inside the caller's transaction.

    The casting query is not materialised (staging ten million wide rows costs more than
    reading the source again): it runs once for the good rows and, only when some row did not
    load, a second time for the rejects. Good rows that repeat an event already loaded are
    found among the loaded rows afterwards and moved to the rejects
    (:func:`forensics.repeats.flag_repeats`), by a casting query that rejects them too.
    """
    eid = scalar(con, "SELECT nextval('evidence_seq')")
    run = runner(con, staged.size, report, watch)
    sql, names = stage_sql(staged.kind, staged.source, staged.tz, staged.defaults)
    loaded = run(0, insert_good(staged.kind, sql, names, str(eid)))
    return finish(con, staged, eid, loaded, run)


def runner(
    con: duckdb.DuckDBPyConnection, size: int, report: Callable[[int, int], None], watch: bool
) -> Callable[[int, str], int]:
    """Run a statement returning a count; with ``watch``, its progress fills a quarter of the
    bar (step 0: the good rows, step 1: the rejects)."""

    def run(step: int, statement: str) -> int:
        if not watch:
            return scalar(con, statement)
        # Two SQL passes share the second half of the progress bar.
        stopper = watch_query(con, lambda f: report(int(size * (0.5 + (step + f) / 4)), size))
        try:
            return scalar(con, statement)
        finally:
            stopper()

    return run


def insert_good(kind: str, sql: str, names: list[str], evidence_id: str) -> str:
    """The INSERT of the rows of casting query ``sql`` that have no problem; ``evidence_id`` is
    SQL (a number, or a column of ``sql`` when one statement loads several files)."""
    targets = ", ".join(sql_ident(n) for n in names)
    picks = ", ".join(f"__kv_t{i}" for i in range(len(names)))
    return (
        f"INSERT INTO {kind} ({targets}, extra, evidence_id, source_row) "
        f"SELECT {picks}, __kv_extra, {evidence_id}, __kv_r FROM ({sql}) WHERE __kv_err IS NULL"
    )


def finish(
    con: duckdb.DuckDBPyConnection,
    staged: Staged,
    eid: int,
    loaded: int,
    run: Callable[[int, str], int],
) -> FileResult:
    """After the good rows of evidence ``eid`` are in: its duplicates, rejects and evidence
    row."""
    kind, fmt, label, sha, size, source, tag = (
        staged.kind,
        staged.fmt,
        staged.label,
        staged.sha,
        staged.size,
        staged.source,
        staged.tag,
    )
    sql = staged.sql()
    outcome = "partial" if source.problem else "loaded"
    # A complete load replaces the partial loads of its path (below), so it repeats their rows
    # by design: those are not duplicates.
    replacing = [] if outcome != "loaded" else _partial_loads(con, label, kind, eid)
    duplicates = conflicts = 0
    if staged.flags is not None:
        flagged = repeats.given_flags(con, staged.flags, tag)
    elif staged.check_duplicates:
        flagged = repeats.flag_repeats(con, kind, eid, label, replacing, tag)
    else:
        flagged = None
    if flagged is not None:
        duplicates, conflicts = first_row(
            con,
            f"SELECT count(*) FILTER (WHERE starts_with(reason, '{EXACT_DUPLICATE}')), "
            f"count(*) FILTER (WHERE NOT starts_with(reason, '{EXACT_DUPLICATE}')) FROM {flagged}",
        )
        con.execute(
            f"DELETE FROM {kind} WHERE evidence_id = {eid} "
            f"AND source_row IN (SELECT source_row FROM {flagged})"
        )
        loaded -= duplicates + conflicts
        sql = staged.sql(flagged)
    # Counting the source is nearly free (Parquet metadata, a temp table, a count the reader
    # kept), and when every row loaded the second pass over the file for rejects can be skipped.
    total = source.rows
    if total is None:
        total = scalar(con, f"SELECT count(*) FROM {source.relation}")
    # (Repeats of rows loaded before were taken off ``loaded``: they are rejects too.)
    if source.redo_for_rejects and loaded < total:
        raise LinesNeeded([])  # the batch knows which file it is
    rejected = 0
    if loaded < total:
        rejected = run(
            1,
            f"INSERT INTO rejects SELECT {eid}, {sql_str(label)}, __kv_r, "
            f"nullif(split_part(__kv_err, {_SEP}, 1), ''), split_part(__kv_err, {_SEP}, 2), "
            f"__kv_raw FROM ({sql}) WHERE __kv_err IS NOT NULL ORDER BY __kv_r",
        )
    if flagged is not None:
        con.execute(f"DROP TABLE {flagged}")
    if loaded + rejected != total:
        # Every source row must land in exactly one of the two tables; never record otherwise.
        raise EvidenceError(
            f"{total} rows read but {loaded} loaded and {rejected} rejected; nothing was kept"
        )
    if source.early_rejects:
        # One statement over parallel lists: executemany costs about a millisecond a row, and
        # a damaged CSV file can hold many thousands of malformed rows.
        rows, cols, reasons, raws = (list(v) for v in zip(*source.early_rejects, strict=True))
        con.execute(
            "INSERT INTO rejects SELECT ?, ?, unnest(?::BIGINT[]), unnest(?::VARCHAR[]), "
            "unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [eid, label, rows, cols, reasons, raws],
        )
    rejected += len(source.early_rejects)
    first_at = last_at = None
    time_col = schema.TIME_COLUMN[kind]
    if time_col:
        first_at, last_at = first_row(
            con,
            f"SELECT min({sql_ident(time_col)}), max({sql_ident(time_col)}) FROM {kind} "
            f"WHERE evidence_id = {eid}",
        )
    read = loaded + rejected
    rows_lost = source.rows_lost if source.problem else 0
    con.execute(
        "INSERT INTO evidence (evidence_id, path, sha256, bytes, kind, format, rows_read, "
        "rows_loaded, rows_rejected, first_at, last_at, loaded_at, outcome, problem, rows_lost) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, current_timestamp, ?, ?, ?)",
        [
            eid,
            label,
            sha,
            size,
            kind,
            fmt,
            read,
            loaded,
            rejected,
            first_at,
            last_at,
            outcome,
            source.problem,
            rows_lost,
        ],
    )
    replaced = _replace_partial(con, label, kind, eid) if outcome == "loaded" else []
    earlier = [sha for _, sha in _other_loads(con, label, kind, eid)]
    return FileResult(
        label,
        sha,
        size,
        kind,
        fmt,
        read,
        loaded,
        rejected,
        first_at,
        last_at,
        skipped=False,
        evidence_id=eid,
        outcome=outcome,
        problem=source.problem,
        rows_lost=rows_lost,
        replaced=replaced,
        earlier=earlier,
        duplicates=duplicates,
        conflicts=conflicts,
    )


def _other_loads(
    con: duckdb.DuckDBPyConnection, label: str, kind: str, eid: int, partial: bool = False
) -> list[tuple[int, str]]:
    """The evidence id and sha256 of the other loads of the path ``label`` (only its partial
    loads with ``partial``), oldest first."""
    only = "AND outcome = 'partial' " if partial else ""
    return con.execute(
        "SELECT evidence_id, sha256 FROM evidence WHERE path = ? AND kind = ? "
        f"{only}AND evidence_id <> ? ORDER BY evidence_id",
        [label, kind, eid],
    ).fetchall()


def _partial_loads(con: duckdb.DuckDBPyConnection, label: str, kind: str, eid: int) -> list[int]:
    """The evidence ids of earlier partial loads of the path ``label``."""
    return [old_id for old_id, _ in _other_loads(con, label, kind, eid, partial=True)]


def _replace_partial(con: duckdb.DuckDBPyConnection, label: str, kind: str, eid: int) -> list[str]:
    """Drop earlier partial loads of the path ``label`` now loaded whole as ``eid``.

    A partial load holds the rows before a damage; once a complete copy of the same file is
    loaded, keeping both would count those rows twice and keep reporting a loss that has been
    repaired. Returns the sha256 of each load dropped.
    """
    old = _other_loads(con, label, kind, eid, partial=True)
    for old_id, _ in old:
        con.execute(f"DELETE FROM {kind} WHERE evidence_id = ?", [old_id])
        con.execute("DELETE FROM rejects WHERE evidence_id = ?", [old_id])
        con.execute("DELETE FROM evidence WHERE evidence_id = ?", [old_id])
    return [sha for _, sha in old]


def column_names(kind: str) -> set[str]:
    return {c.name for c in schema.columns(kind)}


class LinesNeeded(EvidenceError):
    """Files of a batch that DuckDB's JSON reader cannot load as the line reader would (some
    have rejects, whose raw lines only the line reader keeps): the batch is undone."""

    def __init__(self, positions: list[int]):
        super().__init__(f"files {positions} need the line reader")
        self.positions = positions
