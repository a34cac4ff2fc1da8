"""The whole job on one case, in the order data flows: ingest -> detect -> scope -> report.

Commands call these in one line each; the steps below them never call back up. Detection and
scoping are one transaction, so the findings and the notification scope always agree and a
kill or an error leaves the previous pair whole. The report only reads the case database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case
    from forensics.detect import DetectSummary
    from forensics.ingest import IngestResult
    from forensics.progress import StepProgress
    from forensics.report.outputs import ReportResult
    from forensics.scope import Scope


@dataclass(frozen=True)
class RunResult:
    """What ``run_case`` did at each stage.

    Attributes:
        ingested: files and rows loaded, skipped and rejected.
        detected: detector hits, verdict counts, exposures and warnings.
        report: the files written and the headline counts.
        problems: one line per evidence file or pattern that did not load whole; a report on
            incomplete evidence is written, and says so, but is not a clean run.
    """

    ingested: IngestResult
    detected: DetectSummary
    report: ReportResult
    problems: list[str]


def detect_and_scope(
    con: duckdb.DuckDBPyConnection, case: Case, progress: StepProgress | None = None
) -> tuple[DetectSummary, Scope]:
    """Detect, then decide who is notified, and publish both at once.

    Findings and scope are replaced whole or not at all: they are written as temporary tables
    and published in one transaction at the end (``db.publish_findings``), so a detection
    that is killed or fails leaves the previous findings and scope, which a report can still
    read.
    """
    from forensics.db import publish_findings
    from forensics.detect import detect_case
    from forensics.ingest import evidence_in_place, refused_in_place
    from forensics.scope import scope_case

    if case.engine.name != "spark" and evidence_in_place(con):
        from forensics.errors import ForensicsError

        # Its requests are not here: a detection of this database would find it clean.
        raise ForensicsError(refused_in_place(evidence_in_place(con)))
    if case.engine.name == "spark":
        from forensics.spark import detect_on_spark

        detected = detect_on_spark(con, case, progress=progress)
    else:
        detected = detect_case(con, case, progress=progress)
    if progress:
        progress("Scoping notifications", 0, 0)
    scope = scope_case(con, case)
    if progress:
        progress("Writing the findings", 0, 0)
    publish_findings(con)
    return detected, scope


def evidence_problems(con: duckdb.DuckDBPyConnection) -> list[str]:
    """One line per file or pattern of the case database that did not load whole."""
    from forensics.status import evidence_outcomes

    return [o.problem_line for o in evidence_outcomes(con) if o.problem_line is not None]


def report_case(
    con: duckdb.DuckDBPyConnection,
    case: Case,
    out_dir: Path,
    *,
    as_of: datetime | None = None,
    redact: bool = False,
    redact_key: str | None = None,
    progress: StepProgress | None = None,
) -> tuple[ReportResult, list[str]]:
    """Write the report from the findings and scope already in the case database; returns it
    with the evidence problems the report states."""
    from forensics.report import write_report

    result = write_report(
        con,
        case,
        out_dir,
        as_of=as_of,
        redact=redact,
        redact_key=redact_key,
        progress=progress,
    )
    return result, evidence_problems(con)


def run_case(
    case: Case,
    out_dir: Path | None = None,
    *,
    as_of: datetime | None = None,
    on_file: StepProgress | None = None,
    progress: StepProgress | None = None,
) -> RunResult:
    """Ingest a case's evidence, detect, scope and write the report (default ``report/``
    beside the manifest).

    ``on_file`` is told of each evidence file as ingest reaches it; ``progress`` of each step
    of detection and of the report.
    """
    from forensics.db import connect
    from forensics.ingest import IngestResult, ingest_case

    # Evidence read in place is read by detection, on Spark (forensics.lake), not loaded here.
    ingested = IngestResult() if case.engine.in_place else ingest_case(case, progress=on_file)
    con = connect(case.database, memory_limit=case.memory_limit)
    try:
        detected, _ = detect_and_scope(con, case, progress)
        if detected.ingested is not None:
            ingested = detected.ingested
        report, problems = report_case(
            con, case, out_dir or case.folder / "report", as_of=as_of, progress=progress
        )
    finally:
        con.close()
    return RunResult(ingested, detected, report, problems)
