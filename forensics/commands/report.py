"""``forensics report`` and ``forensics run``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from forensics.app import (
    CASE_ARG,
    ENGINE_OPT,
    IN_PLACE_OPT,
    MEMORY_OPT,
    SPARK_CONF_OPT,
    SPARK_MASTER_OPT,
    app,
    error,
    handle_errors,
    with_engine,
)

if TYPE_CHECKING:
    from rich.console import Console

    from forensics.detect import DetectSummary
    from forensics.ingest import IngestResult
    from forensics.report.outputs import ReportResult

OUT_OPT = typer.Option(
    None,
    "--out",
    metavar="DIR",
    help="Output folder (default: report/ beside the manifest).",
    show_default=False,
)


def _check_as_of(value: str | None) -> str | None:
    # Runs while parsing options, so a bad timestamp is a usage error (exit 2).
    if value is not None:
        _as_of(value)
    return value


def _as_of(value: str | None) -> datetime | None:
    from forensics.case import parse_instant

    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise typer.BadParameter(f"not an RFC 3339 timestamp: {value!r} ({exc})") from None


AS_OF_OPT = typer.Option(
    None,
    "--as-of",
    metavar="TS",
    callback=_check_as_of,
    help="Report time, RFC 3339, e.g. 2026-09-12T00:00:00Z (default: the manifest's as_of, "
    "else its end).",
)


def check_out(out: Path | None) -> None:
    """Stop before any work when ``--out`` cannot become a folder: a file has its name, or the
    name of one of its parents (the same words as when the report creates it)."""
    from forensics.errors import ForensicsError

    if out is None:
        return
    current = out
    while not current.exists() and current.parent != current:
        current = current.parent
    if current.exists() and not current.is_dir():
        raise ForensicsError(f"{current}: cannot create the folder (a file has its name)")


def _print_result(console: Console, result: ReportResult) -> None:
    from forensics.terminal import plural, shown, styled

    s = result.summary
    if s.get("basis_headline"):
        console.print(styled((s["basis_headline"], "yellow")))
    console.print(
        f"Affected responses: {s['affected']:,} ({s['confirmed']:,} confirmed, "
        f"{s['likely']:,} likely; {s['affected_excluded']:,} to excluded traffic, "
        f"{s['possible']:,} possible, not notified)"
    )
    # review.csv holds a row per tenant and role, not per response, so its count differs from
    # the possible responses above and the line says what it counts.
    console.print(
        f"Notify: {plural(s['recipients'], 'recipient tenant')}, "
        f"{plural(s['sources'], 'source tenant')}.  Review: "
        f"{plural(s['review'], 'entry', 'entries')} in review.csv (candidate sources, possible"
        " responses, tenants the logs do not name)"
    )
    for figure, caveat in s.get("notify_caveats", {}).items():
        # A count whose tenants the logs do not all name is a floor: said under it, not only
        # in the report.
        console.print(styled((f"{figure.capitalize()}: ", "yellow"), caveat))
    console.print(f"Exploitation: {s['conclusion']}")
    if s.get("coverage_level") not in (None, "complete"):
        # Holes in a log qualify every figure above: said here, not only in the report.
        console.print(styled(("Log coverage: ", "yellow"), s["coverage_statement"]))
    for message in result.messages:
        console.print(styled(("note: ", "yellow"), message))
    console.print(styled("Report: ", (shown(result.out_dir / "report.html"), "bold")))
    console.print(_written(result))


def _written(result: ReportResult) -> str:
    """What was written, in one line: names within the output folder, the notices counted."""
    from forensics.terminal import plural, shown

    notices = set(result.notices)
    names: list[str] = []
    parquet = 0
    for path in result.files:
        if path in notices:
            continue
        relative = path.relative_to(result.out_dir)
        if relative.parent.name == "findings" and path.suffix == ".parquet":
            parquet += 1
            continue
        names.append(relative.as_posix())
    if parquet:
        names.insert(-1, f"findings/ ({parquet} Parquet tables)")
    if notices:
        # One entry for the notices: a large incident has hundreds of them.
        letters = sum(1 for p in notices if p.suffix == ".md")
        each = "each with a CSV of its requests" if letters > 1 else "with a CSV of its requests"
        names.insert(-1, f"notices/ ({plural(letters, 'notice')}, {each})")
    return f"Wrote {len(result.files):,} files to {shown(result.out_dir)}/: {', '.join(names)}"


def _print_warnings(console: Console, warnings: list[str]) -> None:
    from forensics.terminal import styled

    for warning in warnings:
        console.print(styled(("warning: ", "yellow"), warning))


@app.command()
@handle_errors
def report(
    case_path: Path = CASE_ARG,
    out: Path | None = OUT_OPT,
    redact: bool = typer.Option(
        False, "--redact", help="Replace tenant ids by keyed pseudonyms; notices are skipped."
    ),
    redact_key: str | None = typer.Option(
        None,
        "--redact-key",
        metavar="KEY",
        help="Pseudonym key (default: $FORENSICS_REDACT_KEY).",
        show_default=False,
    ),
    as_of: str | None = AS_OF_OPT,
    memory_limit: str | None = MEMORY_OPT,
) -> None:
    """Write the report, CSVs, notices and manifest from the findings."""
    from forensics.db import open_case
    from forensics.pipeline import report_case
    from forensics.terminal import Steps, make_console, styled

    when = _as_of(as_of)
    check_out(out)
    # The report only reads: the findings and scope were written by detection.
    case, con = open_case(case_path, memory_limit, read_only=True)
    try:
        with Steps(make_console(stderr=True)) as steps:
            result, problems = report_case(
                con,
                case,
                out or case.folder / "report",
                as_of=when,
                redact=redact,
                redact_key=redact_key,
                progress=steps.step,
            )
    finally:
        con.close()
    console = make_console()
    _print_result(console, result)
    # The report says so in its summary; the console says it too. (Ingest, where a gap arises,
    # is what exits 1 for it.)
    for line in problems:
        console.print(styled(("incomplete evidence: ", "yellow"), line))


def ingest_line(result: IngestResult) -> str:
    """What an ingest did, in one line: what loaded, what was already there and skipped (same
    sha256), what did not load whole."""
    from forensics.terminal import plural

    skipped = "already loaded (same sha256), skipped"
    if result.files_loaded:
        text = (
            f"{plural(result.files_loaded, 'file')} loaded: rows read {result.rows_read:,}, "
            f"loaded {result.rows_loaded:,}, rejected {result.rows_rejected:,}"
        )
        if result.files_skipped:
            text += f"; {result.files_skipped:,} {skipped}"
    elif result.files_skipped:
        text = f"nothing new: {plural(result.files_skipped, 'file')} {skipped}"
    else:
        text = "no file loaded"
    problems = len(result.problems)
    if problems:
        text += f"; {problems:,} did not load whole (listed at the end)"
    return text + "."


def detect_line(summary: DetectSummary) -> str:
    """What detection found, in one line (the report's lines break the responses down)."""
    from forensics.terminal import plural

    warnings = plural(len(summary.warnings), "warning")
    return (
        f"{plural(summary.exposures, 'exposure')} attributed; "
        f"{warnings}{':' if summary.warnings else '.'}"
    )


@app.command()
@handle_errors
def run(
    case_path: Path = CASE_ARG,
    out: Path | None = OUT_OPT,
    as_of: str | None = AS_OF_OPT,
    memory_limit: str | None = MEMORY_OPT,
    engine: str | None = ENGINE_OPT,
    spark_master: str | None = SPARK_MASTER_OPT,
    spark_conf: list[str] | None = SPARK_CONF_OPT,
    in_place: bool = IN_PLACE_OPT,
):
    """Ingest, detect and report: the main job."""
    from dataclasses import replace

    from forensics.case import load_case
    from forensics.pipeline import run_case
    from forensics.terminal import Steps, make_console, warning_lines

    when = _as_of(as_of)
    check_out(out)
    case = with_engine(load_case(case_path), engine, spark_master, spark_conf, in_place)
    if memory_limit is not None:
        case = replace(case, memory_limit=memory_limit)
    # Files read in place are read by Spark's tasks, not one by one here.
    files = 0 if case.engine.in_place else sum(len(entry.files()) for entry in case.evidence)
    with Steps(make_console(stderr=True), files=files) as steps:
        done = run_case(case, out, as_of=when, on_file=steps.file, progress=steps.step)
    console = make_console()
    console.print(f"Ingest: {ingest_line(done.ingested)}")
    from forensics.commands.ingest import version_lines

    _print_warnings(console, version_lines(done.ingested))
    if done.ingested.rows_rejected:
        console.print("Rejected rows are in the rejects table: see `forensics status`.")
    console.print(f"Detection: {detect_line(done.detected)}")
    _print_warnings(console, warning_lines(done.detected.warnings, done.detected.warning_codes))
    _print_result(console, done.report)
    # Every output is written by now, and the report states what is missing. The same list
    # decides the exit code: a report built on incomplete evidence is not a clean run.
    for line in done.problems:
        error(line)
    if done.problems:
        raise typer.Exit(1)
