"""What a case database holds: evidence files, totals, time span per kind, rejects by reason.

:func:`evidence_outcomes` is the one account of what became of every piece of evidence: each
file loaded whole, loaded in part, or failed, and each manifest pattern that matched nothing.
``forensics status``, the report and its ``manifest.json`` all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from forensics.sql import first_row

if TYPE_CHECKING:
    import duckdb


@dataclass
class EvidenceRow:
    """One row of the ``evidence`` table."""

    evidence_id: int
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
    loaded_at: datetime
    outcome: str = "loaded"
    problem: str | None = None
    rows_lost: int | None = 0


# Outcomes, best first: every row loaded; the rows before a damage loaded; nothing loaded; the
# manifest names a pattern that matched no file.
OUTCOMES = ("loaded", "partial", "failed", "missing")


@dataclass(frozen=True)
class EvidenceOutcome:
    """What became of one evidence file, or of a pattern that matched no file.

    Attributes:
        path: the file as recorded (relative to the case folder for a manifest's files), or
            the pattern that matched nothing.
        kind: the evidence kind.
        format: the evidence format.
        outcome: ``loaded``, ``partial`` (some rows lost to damage), ``failed`` (nothing
            loaded) or ``missing`` (a pattern matched no file).
        reason: why the outcome is not ``loaded``; None when it is.
        rows_lost: rows lost: 0 when loaded, None when unknown (a cut file does not say how
            much it held).
        sha256, bytes: the file's digest and size; None when it could not be read at all.
        rows_read, rows_loaded, rows_rejected: row counts of a (partly) loaded file; None for
            failed files and missing patterns.
        first_at, last_at: the time the loaded rows span.
        entry: the [[evidence]] entry number, known for failures recorded from a manifest.
        evidence_id: the ``evidence`` row of a (partly) loaded file.
    """

    path: str
    kind: str
    format: str
    outcome: str
    reason: str | None = None
    rows_lost: int | None = 0
    sha256: str | None = None
    bytes: int | None = None
    rows_read: int | None = None
    rows_loaded: int | None = None
    rows_rejected: int | None = None
    first_at: datetime | None = None
    last_at: datetime | None = None
    entry: int | None = None
    evidence_id: int | None = None

    @property
    def problem_line(self) -> str | None:
        """One line naming the file (or pattern) and what went wrong; None when loaded."""
        if self.outcome == "partial":
            n = self.rows_loaded or 0
            rows = f"{n:,} row{'' if n == 1 else 's'} loaded"
            return f"{self.path}: partial ({rows}): {self.reason}"
        if self.outcome == "failed":
            return f"{self.path}: failed: {self.reason}"
        if self.outcome == "missing":
            return f"{self.path}: {self.reason}"
        return None

    def sort_key(self) -> tuple:
        """A total order: path, kind, digest, outcome, entry, then the rest of the record (the
        same failure may be recorded twice with different words)."""
        return (
            self.path,
            self.kind,
            self.sha256 or "",
            OUTCOMES.index(self.outcome) if self.outcome in OUTCOMES else len(OUTCOMES),
            self.entry or 0,
            self.evidence_id or 0,
            self.format,
            self.reason or "",
            -1 if self.rows_lost is None else self.rows_lost,
        )


@dataclass
class KindSpan:
    """How much of one kind is loaded and the time it covers."""

    kind: str
    files: int
    rows: int
    first_at: datetime | None
    last_at: datetime | None


@dataclass
class RejectGroup:
    """Rejected rows sharing a kind, column and kind of problem, with one example."""

    kind: str
    column: str | None
    reason: str
    rows: int
    example: str  # "path:row: full reason" of the first such row


@dataclass
class StatusReport:
    """What a case database holds: files, totals, time span per kind, rejects by reason."""

    files: list[EvidenceRow]
    spans: list[KindSpan]
    rejects: list[RejectGroup]
    outcomes: list[EvidenceOutcome] = field(default_factory=list)

    @property
    def problems(self) -> list[EvidenceOutcome]:
        """Every file or pattern whose outcome is not ``loaded``."""
        return [o for o in self.outcomes if o.outcome != "loaded"]

    @property
    def rows_read(self) -> int:
        return sum(f.rows_read for f in self.files)

    @property
    def rows_loaded(self) -> int:
        return sum(f.rows_loaded for f in self.files)

    @property
    def rows_rejected(self) -> int:
        return sum(f.rows_rejected for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    """The columns of a table of the main database (empty when the table does not exist).

    A database made before the outcome columns existed, opened read-only, has not had them
    added; readers here fall back to what such a database means (every file loaded whole).
    """
    return {
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_catalog = current_database() "
            "AND table_name = ?",
            [table],
        ).fetchall()
    }


def _outcome_sql(con: duckdb.DuckDBPyConnection) -> str:
    if "outcome" in _columns(con, "evidence"):
        return "coalesce(outcome, 'loaded'), problem, rows_lost"
    return "'loaded', NULL::VARCHAR, 0::BIGINT"


def evidence_outcomes(con: duckdb.DuckDBPyConnection) -> list[EvidenceOutcome]:
    """What became of every piece of evidence the case database knows of, in a stable order.

    Every file in ``evidence`` (``loaded`` or ``partial``) and every row of
    ``evidence_failures`` (``failed`` files, ``missing`` patterns), sorted on
    :meth:`EvidenceOutcome.sort_key`. The report, its manifest.json and ``forensics status``
    all take the evidence from here.
    """
    outcomes = [
        EvidenceOutcome(
            path=r[0],
            kind=r[1],
            format=r[2],
            outcome=r[3],
            reason=r[4],
            rows_lost=r[5] if r[3] != "loaded" else 0,
            sha256=r[6],
            bytes=r[7],
            rows_read=r[8],
            rows_loaded=r[9],
            rows_rejected=r[10],
            first_at=r[11],
            last_at=r[12],
            evidence_id=r[13],
        )
        for r in con.execute(
            f"SELECT path, kind, format, {_outcome_sql(con)}, sha256, bytes, rows_read, "
            "rows_loaded, rows_rejected, first_at, last_at, evidence_id FROM evidence"
        ).fetchall()
    ]
    if _columns(con, "evidence_failures"):
        # The same failure may be recorded by a manifest ingest and by loading files by name.
        outcomes += [
            EvidenceOutcome(
                path=r[0],
                kind=r[1],
                format=r[2],
                outcome=r[3],
                reason=r[4],
                rows_lost=r[5],
                sha256=r[6],
                bytes=r[7],
                entry=r[8],
            )
            for r in con.execute(
                "SELECT DISTINCT path, kind, format, outcome, reason, rows_lost, sha256, bytes, "
                "entry FROM evidence_failures"
            ).fetchall()
        ]
    outcomes.sort(key=EvidenceOutcome.sort_key)
    return outcomes


def evidence_status(con: duckdb.DuckDBPyConnection) -> StatusReport:
    """Summarise the evidence loaded into a case database, and what failed to load."""
    files = [
        EvidenceRow(*r)
        for r in con.execute(
            "SELECT evidence_id, path, sha256, bytes, kind, format, rows_read, rows_loaded, "
            f"rows_rejected, first_at, last_at, loaded_at, {_outcome_sql(con)} FROM evidence "
            "ORDER BY kind, path, evidence_id"
        ).fetchall()
    ]
    spans = [
        KindSpan(*r)
        for r in con.execute(
            "SELECT kind, count(*), sum(rows_loaded), min(first_at), max(last_at) "
            "FROM evidence GROUP BY kind ORDER BY kind"
        ).fetchall()
    ]
    return StatusReport(
        files=files, spans=spans, rejects=reject_groups(con), outcomes=evidence_outcomes(con)
    )


def reject_groups(con: duckdb.DuckDBPyConnection) -> list[RejectGroup]:
    """Rejected rows grouped by kind, column and kind of problem, most frequent first."""
    # Reasons quote the offending value after ": "; group on the wording before it.
    return [
        RejectGroup(*r)
        for r in con.execute(
            "WITH r AS (SELECT e.kind, r.column_name, split_part(r.reason, ': ', 1) AS reason, "
            "r.path || ':' || r.source_row || ': ' || r.reason AS example, "
            "r.evidence_id, r.source_row FROM rejects r JOIN evidence e USING (evidence_id)) "
            "SELECT kind, column_name, reason, count(*), "
            "arg_min(example, (evidence_id, source_row)) FROM r "
            "GROUP BY ALL ORDER BY count(*) DESC, kind, column_name, reason"
        ).fetchall()
    ]


# The two kinds of duplicate ingest rejects (forensics.repeats.flag_repeats): their reasons start
# with these words.
EXACT_DUPLICATE = "exact duplicate"
CONFLICTING_DUPLICATE = "conflicting duplicate"


@dataclass
class Duplicates:
    """Rows rejected because they repeat an event already loaded.

    ``exact`` repeat it word for word (overlapping log files); ``conflicting`` tell it
    differently (a retry logged twice, a replayed or edited log) and are listed in ``shown``
    (kind, path, row, reason), the first ``limit`` of them.
    """

    exact: int
    conflicting: int
    shown: list[tuple[str, str, int, str]]


def duplicate_rejects(con: duckdb.DuckDBPyConnection, limit: int = 50) -> Duplicates:
    """How many rows were rejected as duplicates, and the conflicting ones first in file order."""
    exact, conflicting = first_row(
        con,
        f"SELECT count(*) FILTER (WHERE starts_with(reason, '{EXACT_DUPLICATE}:')), "
        f"count(*) FILTER (WHERE starts_with(reason, '{CONFLICTING_DUPLICATE}:')) FROM rejects",
    )
    shown = con.execute(
        "SELECT e.kind, r.path, r.source_row, r.reason FROM rejects r "
        "JOIN evidence e USING (evidence_id) "
        f"WHERE starts_with(r.reason, '{CONFLICTING_DUPLICATE}:') "
        "ORDER BY r.path, r.source_row, r.evidence_id LIMIT ?",
        [limit],
    ).fetchall()
    return Duplicates(exact, conflicting, [tuple(r) for r in shown])
