"""What a case database holds: evidence files, totals, time span per kind, rejects by reason."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

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


def evidence_status(con: duckdb.DuckDBPyConnection) -> StatusReport:
    """Summarise the evidence loaded into a case database."""
    files = [
        EvidenceRow(*r)
        for r in con.execute(
            "SELECT evidence_id, path, sha256, bytes, kind, format, rows_read, rows_loaded, "
            "rows_rejected, first_at, last_at, loaded_at FROM evidence "
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
    # Reasons quote the offending value after ": "; group on the wording before it.
    rejects = [
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
    return StatusReport(files=files, spans=spans, rejects=rejects)
