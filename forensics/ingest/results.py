"""What ingest tells its caller: each file's result, each failure, and their totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from forensics.status import EvidenceOutcome


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

    def _loaded_now(self, count: str) -> int:
        # Files skipped as already loaded count in the run that loaded them, not here.
        return sum(getattr(f, count) for f in self.files if not f.skipped)

    @property
    def rows_read(self) -> int:
        return self._loaded_now("rows_read")

    @property
    def rows_loaded(self) -> int:
        return self._loaded_now("rows_loaded")

    @property
    def rows_rejected(self) -> int:
        return self._loaded_now("rows_rejected")

    @property
    def duplicates(self) -> int:
        """Rows rejected as exact duplicates of rows already loaded."""
        return self._loaded_now("duplicates")

    @property
    def conflicts(self) -> int:
        """Rows rejected as conflicting duplicates: an event already loaded, told differently."""
        return self._loaded_now("conflicts")

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
