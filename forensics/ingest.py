"""Canonical ingest: evidence files into the typed tables of a case database.

One file loads in one transaction; a run of canonical Parquet files with the same columns
loads in one transaction and one statement, which DuckDB reads file-parallel. Every source
value is read as text (or as its Parquet physical type) and cast to its canonical type by a
single vectorised DuckDB query; rows with a missing required value or a value that does not
cast go to ``rejects`` with a reason a responder can act on, never silently dropped. Each
file gets one ``evidence`` row with its sha256, so a file already loaded is recognised and
skipped.

No evidence goes missing unnoticed: a damaged compressed file loads the rows before its damage
and is recorded as ``partial`` with what was lost; a file that cannot be loaded at all, and a
manifest pattern that matches no file, are recorded in ``evidence_failures``.
:func:`evidence_outcomes` reads both back.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forensics import repeats, schema
from forensics.casts import _SEP, stage_sql
from forensics.errors import EvidenceError, ForensicsError, ResourceError
from forensics.progress import StepProgress
from forensics.readers import Source, open_source, sql_ident, sql_str
from forensics.sql import first_row, scalar
from forensics.status import (  # re-exported: the status API belongs to ingest's public face
    EXACT_DUPLICATE,
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

# progress(file label, bytes done, bytes total): called as a file is read and loaded.
Progress = StepProgress

SUPPORTED_FORMATS = ("canonical", "sglang", "otel", "litellm", "cloudflare", "auto")
_tags = itertools.count(1)

__all__ = [
    "EvidenceOutcome",
    "EvidenceRow",
    "FileFailure",
    "FileResult",
    "IngestResult",
    "KindSpan",
    "RejectGroup",
    "StatusReport",
    "evidence_outcomes",
    "evidence_status",
    "ingest_case",
    "ingest_file",
    "ingest_paths",
]


@dataclass
class FileResult:
    """What happened to one evidence file.

    ``outcome`` is ``loaded`` (every row read) or ``partial`` (a damaged compressed file: the
    rows before the damage were read; ``problem`` says what was lost, ``rows_lost`` how many
    rows, None when unknown). ``replaced`` lists the sha256 of earlier partial loads of the same
    path that this complete load replaced; ``earlier`` the sha256 of other contents of the same
    path loaded before and still in the case (an edited or regenerated file: both versions are
    now in it). ``duplicates`` and ``conflicts`` count the rejected
    rows that repeat an event already loaded, with the same content (overlapping files) or a
    different one (see ``schema.IDENTITY``).
    """

    path: str
    sha256: str
    bytes: int
    kind: str
    format: str
    rows_read: int
    rows_loaded: int
    rows_rejected: int
    first_at: datetime | None
    last_at: datetime | None
    skipped: bool
    evidence_id: int
    outcome: str = "loaded"
    problem: str | None = None
    rows_lost: int | None = 0
    replaced: list[str] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)
    duplicates: int = 0
    conflicts: int = 0

    def as_outcome(self) -> EvidenceOutcome:
        """This file as an :class:`EvidenceOutcome`."""
        return EvidenceOutcome(
            path=self.path,
            kind=self.kind,
            format=self.format,
            outcome=self.outcome,
            reason=self.problem,
            rows_lost=self.rows_lost if self.outcome != "loaded" else 0,
            sha256=self.sha256,
            bytes=self.bytes,
            rows_read=self.rows_read,
            rows_loaded=self.rows_loaded,
            rows_rejected=self.rows_rejected,
            first_at=self.first_at,
            last_at=self.last_at,
            evidence_id=self.evidence_id,
        )


@dataclass
class FileFailure:
    """A file that could not be loaded at all, or a pattern that matched no file.

    ``message`` is one line without the path. ``outcome`` is ``failed`` (a file) or
    ``missing`` (a pattern); ``entry`` is the [[evidence]] number when it comes from a case
    manifest; ``sha256`` and ``bytes`` are known when the file could be read; ``rows_lost``
    when the file says how many rows it holds (a Parquet footer), else None.
    """

    path: str
    kind: str
    message: str
    format: str = "canonical"
    entry: int | None = None
    outcome: str = "failed"
    sha256: str | None = None
    bytes: int | None = None
    rows_lost: int | None = None
    file: str | None = None  # the resolved path of a failed file

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def as_outcome(self) -> EvidenceOutcome:
        """This failure as an :class:`EvidenceOutcome`."""
        return EvidenceOutcome(
            path=self.path,
            kind=self.kind,
            format=self.format,
            outcome=self.outcome,
            reason=self.message,
            rows_lost=self.rows_lost,
            sha256=self.sha256,
            bytes=self.bytes,
            entry=self.entry,
        )


@dataclass
class IngestResult:
    """The outcome of loading several files: per-file results, failures and totals."""

    files: list[FileResult] = field(default_factory=list)
    failures: list[FileFailure] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """One line per failed file or pattern that matched nothing, naming it."""
        return [str(f) for f in self.failures]

    @property
    def outcomes(self) -> list[EvidenceOutcome]:
        """Every file and pattern of this ingest with its outcome, in a stable order."""
        found = [f.as_outcome() for f in self.files] + [f.as_outcome() for f in self.failures]
        return sorted(found, key=EvidenceOutcome.sort_key)

    @property
    def problems(self) -> list[str]:
        """One line per file or pattern whose evidence did not load whole: partial files
        (already loaded ones included: they are still partial), failed files, patterns that
        matched nothing."""
        return [o.problem_line for o in self.outcomes if o.problem_line is not None]

    @property
    def ok(self) -> bool:
        """Every file loaded whole and every pattern matched."""
        return not self.failures and all(f.outcome == "loaded" for f in self.files)

    @property
    def rows_read(self) -> int:
        return sum(f.rows_read for f in self.files if not f.skipped)

    @property
    def rows_loaded(self) -> int:
        return sum(f.rows_loaded for f in self.files if not f.skipped)

    @property
    def rows_rejected(self) -> int:
        return sum(f.rows_rejected for f in self.files if not f.skipped)

    @property
    def duplicates(self) -> int:
        """Rows rejected as exact duplicates of rows already loaded."""
        return sum(f.duplicates for f in self.files if not f.skipped)

    @property
    def conflicts(self) -> int:
        """Rows rejected as conflicting duplicates: an event already loaded, told differently."""
        return sum(f.conflicts for f in self.files if not f.skipped)

    @property
    def files_loaded(self) -> int:
        return sum(1 for f in self.files if not f.skipped)

    @property
    def files_skipped(self) -> int:
        return sum(1 for f in self.files if f.skipped)

    @property
    def files_partial(self) -> int:
        """Files (loaded now or before) that hold only the rows before a damage."""
        return sum(1 for f in self.files if f.outcome == "partial")

    @property
    def files_failed(self) -> int:
        return sum(1 for f in self.failures if f.outcome == "failed")

    @property
    def patterns_missing(self) -> int:
        return sum(1 for f in self.failures if f.outcome == "missing")


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


def _existing(con: duckdb.DuckDBPyConnection, sha: str) -> tuple | None:
    return con.execute(
        "SELECT evidence_id, path, bytes, kind, format, rows_read, rows_loaded, rows_rejected, "
        "first_at, last_at, outcome, problem, rows_lost FROM evidence WHERE sha256 = ?",
        [sha],
    ).fetchone()


def _watch_query(con: duckdb.DuckDBPyConnection, report: Callable[[float], None]):
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
    tag = str(next(_tags))
    source: Source | None = None
    con.execute("BEGIN TRANSACTION")
    try:
        try:
            # Reading is the first half of the work, casting and inserting the second.
            source, fmt_name = _open(
                con,
                path,
                kind,
                fmt_name,
                tag,
                lambda d, t: report(d // 2, t),
                defaults,
                tenant_field,
            )
            staged = _Staged(
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
    seen = _existing(con, sha)
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


def _open(
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
        _check_canonical(kind, tenant_field)
        source = _with_tenant_field(open_source(con, path, tag, progress), tenant_field)
    return source, fmt


def _check_canonical(kind: str, tenant_field: str | None) -> None:
    from forensics import adapters

    problem = adapters.check_entry("canonical", kind, tenant_field)
    if problem:
        raise EvidenceError(problem)


def _with_tenant_field(source: Source, tenant_field: str | None) -> Source:
    if tenant_field is not None and not source.empty:
        # The tenant is in a column of another name: it stands for tenant_id.
        if tenant_field not in source.columns:
            raise EvidenceError(f"no column {tenant_field!r} (the entry's tenant_field)")
        source.columns["tenant_id"] = source.columns[tenant_field]
    return source


@dataclass
class _Staged:
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
    staged: _Staged,
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
    run = _runner(con, staged.size, report, watch)
    sql, names = stage_sql(staged.kind, staged.source, staged.tz, staged.defaults)
    loaded = run(0, _insert_good(staged.kind, sql, names, str(eid)))
    return _finish(con, staged, eid, loaded, run)


def _runner(
    con: duckdb.DuckDBPyConnection, size: int, report: Callable[[int, int], None], watch: bool
) -> Callable[[int, str], int]:
    """Run a statement returning a count; with ``watch``, its progress fills a quarter of the
    bar (step 0: the good rows, step 1: the rejects)."""

    def run(step: int, statement: str) -> int:
        if not watch:
            return scalar(con, statement)
        # Two SQL passes share the second half of the progress bar.
        stopper = _watch_query(con, lambda f: report(int(size * (0.5 + (step + f) / 4)), size))
        try:
            return scalar(con, statement)
        finally:
            stopper()

    return run


def _insert_good(kind: str, sql: str, names: list[str], evidence_id: str) -> str:
    """The INSERT of the rows of casting query ``sql`` that have no problem; ``evidence_id`` is
    SQL (a number, or a column of ``sql`` when one statement loads several files)."""
    targets = ", ".join(sql_ident(n) for n in names)
    picks = ", ".join(f"__kv_t{i}" for i in range(len(names)))
    return (
        f"INSERT INTO {kind} ({targets}, extra, evidence_id, source_row) "
        f"SELECT {picks}, __kv_extra, {evidence_id}, __kv_r FROM ({sql}) WHERE __kv_err IS NULL"
    )


def _finish(
    con: duckdb.DuckDBPyConnection,
    staged: _Staged,
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
        raise _LinesNeeded([])  # the batch knows which file it is
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


# --- many files ------------------------------------------------------------------------------


def file_label(path: Path, folder: Path) -> str:
    """A path relative to the case folder when it lies inside it (portable, stable)."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(path)


def _columns(kind: str) -> set[str]:
    return {c.name for c in schema.columns(kind)}


def entry_defaults(kind: str, entry: Any) -> dict[str, Any]:
    names = _columns(kind)
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


# A job: (path, kind, format, time zone, defaults, label, tenant_field).
_Job = tuple[Path, str, str, str, dict[str, Any], str, str | None]

# Canonical Parquet and JSON Lines files of one entry load in one statement, up to this many
# bytes: DuckDB reads the files of one statement in parallel, but a Parquet file of one row
# group or a compressed file on one thread (a 1M-request case's daily Parquet files loaded in
# half the time together).
BATCH_BYTES = 1 << 30
# Virtual columns the batched read relies on; a file with a real column of such a name loads
# on its own.
_VIRTUAL = frozenset({"file_index", "file_row_number", "filename"})


@dataclass
class _Batchable:
    job: _Job
    sha: str
    size: int
    key: tuple  # what files must share to load together: kind, zone, defaults, file type...
    file_type: str  # parquet | jsonl
    compression: str | None


class _LinesNeeded(EvidenceError):
    """Files of a batch that DuckDB's JSON reader cannot load as the line reader would (some
    have rejects, whose raw lines only the line reader keeps): the batch is undone."""

    def __init__(self, positions: list[int]):
        super().__init__(f"files {positions} need the line reader")
        self.positions = positions


def _load_all(
    con: duckdb.DuckDBPyConnection,
    jobs: Iterable[_Job],
    result: IngestResult,
    progress: Progress | None,
    entry: int | None = None,
) -> None:
    """Load ``jobs`` in order: runs of canonical Parquet files with the same columns, and of
    canonical JSON Lines files, together (:func:`_load_batch`), every other file on its own
    (:func:`ingest_file`)."""
    pending: list[_Batchable] = []
    jobs = list(jobs)
    hashes = _HashesAhead([job[0] for job in jobs if job[2] == "canonical"])

    def load(items: list[_Batchable], again: bool) -> None:
        # One Parquet file gains nothing from a batch; one JSON Lines file gains DuckDB's reader.
        if len(items) > 1 or (items and items[0].file_type == "jsonl"):
            loaded, alone = _load_batch(con, items, progress)
            if loaded is not None:
                for item, done in zip(items, loaded, strict=True):
                    _loaded(con, result, done, item.job[0])
                return
            if again and alone:
                # The files only the line reader reads load alone, the runs between them
                # together once more, all in their order (which of two repeats is the older
                # depends on it).
                run: list[_Batchable] = []
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
            item = _batchable(con, job, hashes)
            if pending and (
                item is None
                or item.key != pending[0].key
                or item.sha in {p.sha for p in pending}
                or sum(p.size for p in pending) + item.size > BATCH_BYTES
            ):
                flush()
            if item is not None:
                pending.append(item)
            else:
                _load_one(con, job, result, progress, entry)
        flush()
    finally:
        hashes.close()


class _HashesAhead:
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


def _loaded(
    con: duckdb.DuckDBPyConnection, result: IngestResult, done: FileResult, path: Path
) -> None:
    result.files.append(done)
    # The file is in the database now: a failure recorded for it earlier is history.
    con.execute("DELETE FROM evidence_failures WHERE file = ?", [str(path.resolve())])


def _load_one(
    con: duckdb.DuckDBPyConnection,
    job: _Job,
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


def _batchable(
    con: duckdb.DuckDBPyConnection, job: _Job, hashes: _HashesAhead
) -> _Batchable | None:
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
    if _existing(con, sha) is not None:
        return None
    key = (kind, tz, tuple(sorted((k, str(v)) for k, v in defaults.items())), tenant_field)
    if file_type == "jsonl":
        # Their keys are read when the batch loads (readers.json_lines_natively).
        return _Batchable(job, sha, size, (*key, file_type, compression), file_type, compression)
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
    return _Batchable(job, sha, size, key + columns, file_type, compression)


def _load_batch(
    con: duckdb.DuckDBPyConnection, batch: list[_Batchable], progress: Progress | None
) -> tuple[list[FileResult] | None, list[int]]:
    """Load several canonical Parquet files of the same columns, or canonical JSON Lines files
    that DuckDB's JSON reader reads exactly (:func:`~forensics.readers.json_lines_natively`),
    in one transaction, their good rows by one statement; then each file's duplicates, rejects
    and evidence row as a single file's (:func:`_finish`).

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
        staged_rows = f"__kv_native_{next(_tags)}"
        # Outside the transaction: a file DuckDB's reader fails on would abort it.
        stopper = _watch_query(con, lambda f: report(f / 3)) if progress else None
        try:
            _check_canonical(kind, field_)
            # A key outside the schema (a tenant_field among them) goes to a row's extra
            # column, which the line reader builds: such files are read by it.
            native = json_lines_natively(con, paths, batch[0].compression, _columns(kind))
            if native.declined:
                return None, native.declined
            sources = [_with_tenant_field(source, field_) for source in native.sources]
        except EvidenceError:
            return None, []
        finally:
            if stopper:
                stopper()
        stopper = _watch_query(con, lambda f: report((1 + f) / 3)) if progress else None
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
        tags = [str(next(_tags)) for _ in batch]
        if batch[0].file_type == "jsonl":
            relation, position, row = native.numbered(staged_rows), "__kv_file_no", "__kv_row"
        else:
            for path, tag in zip(paths, tags, strict=True):
                sources.append(_open(con, path, kind, "canonical", tag, None, defaults, field_)[0])
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
        statement = _insert_good(kind, sql, names, "__kv_eid")
        stopper = _watch_query(con, lambda f: report(first + rest * f)) if progress else None
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
            raise _LinesNeeded(short)
        # One look for the whole batch; only when it may hold a repeat does each file take
        # the exact check (which scans everything loaded before it, file after file).
        may_repeat = repeats.may_repeat(con, kind, eids)
        results = []
        for i, (item, source, tag, eid) in enumerate(zip(batch, sources, tags, eids, strict=True)):
            staged = _Staged(
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
            run = _runner(con, item.size, lambda d, t: None, False)
            try:
                results.append(_finish(con, staged, eid, counts.get(eid, 0), run))
            except _LinesNeeded:
                raise _LinesNeeded([i]) from None  # a repeat of a row loaded before
        con.execute("COMMIT")
    except _LinesNeeded as exc:
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
    defaults = {k: v for k, v in given.items() if v is not None and k in _columns(kind)}
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
