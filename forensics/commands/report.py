"""``forensics report`` and ``forensics run``."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer

from forensics.cli import MEMORY_OPT, app, handle_errors

CASE_ARG = typer.Argument(..., help="The case manifest (case.toml).")
OUT_OPT = typer.Option(None, "--out", help="Output folder (default: report/ beside the manifest).")


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
    callback=_check_as_of,
    help="Report time, RFC 3339 (default: the manifest's as_of or end).",
)


def _print_result(console, result) -> None:
    from rich.markup import escape

    s = result.summary
    if s.get("basis_headline"):
        console.print(f"[yellow]{escape(s['basis_headline'])}[/yellow]")
    console.print(
        f"Affected responses: {s['affected']:,} ({s['confirmed']:,} confirmed, "
        f"{s['likely']:,} likely; {s['affected_excluded']:,} to excluded traffic, "
        f"{s['possible']:,} possible to review)"
    )
    console.print(
        f"Notify: {s['recipients']:,} recipient tenants, {s['sources']:,} source tenants."
        f"  Review: {s['review']:,} candidate{'' if s['review'] == 1 else 's'} (review.csv)"
    )
    console.print(f"Exploitation: {s['conclusion']}", markup=False)
    for message in result.messages:
        console.print(f"[yellow]note:[/yellow] {message}")
    console.print(f"Wrote {len(result.files)} files to {result.out_dir}:", markup=False)
    notices = set(result.notices)
    for path in result.files:
        if path not in notices:
            console.print(f"  {path}", markup=False, highlight=False)
    if notices:
        # One line for the notices: a large incident has hundreds of them.
        folder = result.notices[0].parent
        letters = sum(1 for p in notices if p.suffix == ".md")
        console.print(
            f"  {folder}/ ({letters:,} notices, each with a CSV of its requests)",
            markup=False,
            highlight=False,
        )


@app.command()
@handle_errors
def report(
    case_path: Path = CASE_ARG,
    out: Path | None = OUT_OPT,
    redact: bool = typer.Option(
        False, "--redact", help="Replace tenant ids by keyed pseudonyms; notices are skipped."
    ),
    redact_key: str | None = typer.Option(
        None, "--redact-key", help="Pseudonym key (default: $FORENSICS_REDACT_KEY)."
    ),
    as_of: str | None = AS_OF_OPT,
    memory_limit: str | None = MEMORY_OPT,
) -> None:
    """Render the report, CSVs, customer notices and manifest from a case's findings."""
    from rich.console import Console
    from rich.text import Text

    from forensics.db import open_case
    from forensics.report import write_report

    when = _as_of(as_of)
    case, con = open_case(case_path, memory_limit)
    result = write_report(
        con, case, out or case.folder / "report", as_of=when, redact=redact, redact_key=redact_key
    )
    console = Console()
    _print_result(console, result)
    # The report says so in its summary; the console says it too. (Ingest, where a gap arises,
    # is what exits 1 for it.)
    for line in _evidence_problems(con):
        # Assembled as text: a pattern such as [[evidence]] is no console markup.
        console.print(Text.assemble(("incomplete evidence: ", "yellow"), line), highlight=False)


def _evidence_problems(con) -> list[str]:
    """One line per file or pattern of the case database that did not load whole."""
    from forensics.ingest import evidence_outcomes

    return [o.problem_line for o in evidence_outcomes(con) if o.outcome != "loaded"]


@app.command()
@handle_errors
def run(
    case_path: Path = CASE_ARG,
    out: Path | None = OUT_OPT,
    as_of: str | None = AS_OF_OPT,
    memory_limit: str | None = MEMORY_OPT,
):
    """Ingest every evidence entry, run detection and write the report outputs."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from forensics.case import load_case
    from forensics.db import connect, transaction
    from forensics.detect import detect_case
    from forensics.ingest import ingest_case
    from forensics.report import write_report
    from forensics.report.render import plural
    from forensics.scope import scope_case

    when = _as_of(as_of)
    case = load_case(case_path)
    if memory_limit is not None:
        from dataclasses import replace

        case = replace(case, memory_limit=memory_limit)
    console = Console()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("Ingesting evidence", total=None)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=f"Ingesting {label}", completed=done, total=total)

        ingested = ingest_case(case, progress=progress)
        bar.update(task, description="Running detectors", completed=0, total=None)
        con = connect(case.database, memory_limit=case.memory_limit)
        # Findings and scope are replaced whole or not at all (a kill, an error).
        with transaction(con):
            detected = detect_case(con, case)
            bar.update(task, description="Scoping notifications")
            scope = scope_case(con, case)
        bar.update(task, description="Writing the report")
        result = write_report(con, case, out or case.folder / "report", as_of=when, scope=scope)
    console.print(
        f"Ingested {len(ingested.files):,} files ({plural(len(ingested.problems), 'problem')}); "
        f"detection: {detected.affected:,} affected, {detected.exposures:,} exposures, "
        f"{len(detected.warnings):,} warnings."
    )
    _print_result(console, result)
    # Every output is written by now, and the report states what is missing. The same list
    # decides the exit code: a report built on incomplete evidence is not a clean run.
    problems = _evidence_problems(con)
    for line in problems:
        typer.secho(f"Error: {line}", err=True, fg="red")
    if problems:
        raise typer.Exit(1)
