"""``forensics ingest`` and ``forensics status``: load evidence, show what is loaded."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from forensics.cli import MEMORY_OPT, app, handle_errors
from forensics.schema import KINDS

if TYPE_CHECKING:
    from rich.console import Console

    from forensics.ingest import IngestResult, StatusReport

Kind = StrEnum("Kind", {k: k for k in KINDS})

# Files smaller than this load too fast for a progress bar to help.
_BAR_BYTES = 8 << 20


@app.command()
def ingest(
    target: str = typer.Argument(..., help="CASE.toml, or the case database for the file form."),
    files: list[str] = typer.Argument(None, help="Evidence files or globs (file form only)."),
    kind: Kind | None = typer.Option(None, "--kind", help="Evidence kind of FILE... (file form)."),
    fmt: str = typer.Option("canonical", "--format", help="Evidence format (file form)."),
    timezone: str = typer.Option(
        "UTC", "--timezone", help="Zone of timestamps without an offset (file form)."
    ),
    memory_limit: str | None = MEMORY_OPT,
) -> None:
    """Load evidence: `ingest CASE.toml`, or `ingest DB FILE... --kind KIND [--format F]`."""
    from forensics.case import FORMATS

    if target.endswith(".toml"):
        if files or kind is not None:
            raise typer.BadParameter(
                "with a CASE.toml, files and --kind come from its [[evidence]] entries"
            )
    else:
        if not files:
            raise typer.BadParameter(
                "give CASE.toml, or a database followed by evidence files", param_hint="FILE..."
            )
        if kind is None:
            raise typer.BadParameter("the file form needs --kind", param_hint="--kind")
        if fmt not in FORMATS:
            raise typer.BadParameter(
                f"{fmt!r} is not one of {', '.join(FORMATS)}", param_hint="--format"
            )
    _ingest(target, files or [], kind.value if kind else None, fmt, timezone, memory_limit)


@handle_errors
def _ingest(
    target: str,
    files: list[str],
    kind: str | None,
    fmt: str,
    timezone: str,
    memory_limit: str | None = None,
) -> None:
    from rich.console import Console

    from forensics.ingest import ingest_case, ingest_paths

    console = Console(stderr=True)
    with _Bar(console) as progress:
        if kind is None:
            from forensics.case import load_case

            case = load_case(target)
            if memory_limit is not None:
                from dataclasses import replace

                case = replace(case, memory_limit=memory_limit)
            result = ingest_case(case, progress=progress)
            where = case.database
        else:
            result = ingest_paths(
                target, files, kind, fmt, timezone, progress=progress, memory_limit=memory_limit
            )
            where = Path(target)
    _summary(Console(width=max(Console().width, 120)), result, where)
    # Everything else has loaded by now; evidence that did not load whole is an error.
    problems = result.problems
    for line in problems:
        typer.secho(f"Error: {line}", err=True, fg="red")
    if problems:
        raise typer.Exit(1)


class _Bar:
    """A rich progress bar that appears only for files large enough to need one."""

    def __init__(self, console: Console):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            # Only on a terminal: in a log or a pipe a bar is noise, and an error must stay
            # the one line the command prints.
            disable=not console.is_terminal,
        )
        self.tasks: dict[str, int] = {}
        self.started = False

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.progress.__exit__(*exc)

    def __call__(self, label: str, done: int, total: int) -> None:
        if total < _BAR_BYTES:
            return
        if not self.started:
            # Started with the first bar: an idle display still writes a line.
            self.progress.__enter__()
            self.started = True
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task(Path(label).name, total=total)
        self.progress.update(self.tasks[label], completed=done)


def plural(count: int, word: str) -> str:
    """``count`` and the noun in the right number: ``1 pattern``, ``2 patterns``."""
    return f"{count:,} {word if count == 1 else word + 's'}"


def _summary(console: Console, result: IngestResult, where: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"Evidence loaded into {where}", title_justify="left")
    table.add_column("file", overflow="fold")
    table.add_column("kind")
    for name in ("read", "loaded", "rejected"):
        table.add_column(name, justify="right")
    table.add_column("status")
    for f in result.files:
        status = "already loaded" if f.skipped else "loaded"
        if f.rows_rejected and not f.skipped:
            status = "loaded, with rejects"
        if f.outcome == "partial":
            status = "[red]PARTIAL[/red]" + (" (already loaded)" if f.skipped else "")
        table.add_row(
            f.path, f.kind, f"{f.rows_read:,}", f"{f.rows_loaded:,}", f"{f.rows_rejected:,}", status
        )
    for failure in result.failures:
        status = "[red]NO FILE[/red]" if failure.outcome == "missing" else "[red]FAILED[/red]"
        # A pattern such as logs/[0-9]*.jsonl is text, not console markup.
        table.add_row(escape(failure.path), failure.kind, "-", "-", "-", status)
    console.print(table)
    # Problems are named only when there are some, so a clean ingest reads as it always has.
    more = ""
    if result.files_partial:
        more += f", {result.files_partial} partial"
    if result.patterns_missing:
        more += f", {plural(result.patterns_missing, 'pattern')} matching no file"
    console.print(
        f"{result.files_loaded} loaded, {result.files_skipped} already loaded, "
        f"{result.files_failed} failed{more}; rows read {result.rows_read:,}, "
        f"loaded {result.rows_loaded:,}, rejected {result.rows_rejected:,}",
        highlight=False,
    )
    if result.duplicates or result.conflicts:
        # Rejected, never loaded twice; said here because a repeated event is a finding itself.
        console.print(
            f"Duplicates rejected: {plural(result.duplicates, 'exact duplicate')} of rows "
            f"already loaded (the same event in overlapping files), "
            f"{plural(result.conflicts, 'conflicting duplicate')} (an event already loaded, "
            "with different content: a retry logged twice, a replayed or edited log).",
            highlight=False,
        )
    for f in result.files:
        for sha in f.replaced:
            console.print(
                f"{f.path}: loaded whole; replaces its earlier partial load (sha256 {sha[:12]})",
                highlight=False,
                markup=False,
            )
    if result.rows_rejected:
        console.print("Rejected rows are in the rejects table: see `forensics status`.")


@app.command()
@handle_errors
def status(case_path: Path = typer.Argument(..., help="The case manifest (case.toml).")) -> None:
    """Show the evidence loaded: files, sha256, rows, rejects, time span."""
    from rich.console import Console

    from forensics.case import load_case
    from forensics.db import connect
    from forensics.errors import ForensicsError
    from forensics.ingest import evidence_status

    case = load_case(case_path)
    if not case.database.exists():
        raise ForensicsError(
            f"{case.database}: no case database yet; run `forensics ingest {case_path}` first"
        )
    con = connect(case.database, read_only=True)
    try:
        report = evidence_status(con)
    finally:
        con.close()
    _print_status(Console(width=max(Console().width, 140)), report, case.database)


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _print_status(console: Console, report: StatusReport, where: Path) -> None:
    from rich.table import Table

    if not report.files:
        console.print(f"No evidence loaded in {where} yet.")
        _print_problems(console, report)
        return
    files = Table(title=f"Evidence in {where}", title_justify="left")
    # Paths are what a responder copies: give them room before the other columns.
    widest = max(len(f.path) for f in report.files)
    files.add_column("path", overflow="fold", min_width=min(widest, 36))
    for name in ("kind", "format", "sha256"):
        files.add_column(name, overflow="fold")
    for name in ("rows", "rejects"):
        files.add_column(name, justify="right")
    files.add_column("first (UTC)")
    files.add_column("last (UTC)")
    files.add_column("outcome")
    for f in report.files:
        files.add_row(
            f.path,
            f.kind,
            f.format,
            f.sha256[:12],
            f"{f.rows_loaded:,}",
            f"{f.rows_rejected:,}",
            _when(f.first_at),
            _when(f.last_at),
            "[red]partial[/red]" if f.outcome == "partial" else f.outcome,
        )
    console.print(files)
    console.print(
        f"Total: {len(report.files)} files, {report.bytes:,} bytes, rows read "
        f"{report.rows_read:,}, loaded {report.rows_loaded:,}, rejected {report.rows_rejected:,}",
        highlight=False,
    )
    _print_problems(console, report)
    spans = Table(title="Time span per kind", title_justify="left")
    for name in ("kind", "files", "rows", "first (UTC)", "last (UTC)"):
        spans.add_column(name, justify="right" if name in ("files", "rows") else "left")
    for s in report.spans:
        spans.add_row(s.kind, str(s.files), f"{s.rows:,}", _when(s.first_at), _when(s.last_at))
    console.print(spans)
    if not report.rejects:
        console.print("No rejected rows.")
        return
    rejects = Table(title="Rejected rows by reason", title_justify="left")
    for name in ("kind", "column", "reason", "rows", "first example"):
        rejects.add_column(name, justify="right" if name == "rows" else "left", overflow="fold")
    for r in report.rejects:
        rejects.add_row(r.kind, r.column or "-", r.reason, f"{r.rows:,}", r.example)
    console.print(rejects)


def _print_problems(console: Console, report: StatusReport) -> None:
    """The evidence that did not load whole: partial files, failed files, empty patterns."""
    from rich.markup import escape
    from rich.table import Table

    problems = report.problems
    if not problems:
        return
    table = Table(title="Evidence that did not load whole", title_justify="left")
    table.add_column("path or pattern", overflow="fold", min_width=24)
    for name in ("kind", "outcome"):
        table.add_column(name)
    table.add_column("rows lost", justify="right")
    table.add_column("reason", overflow="fold")
    for o in problems:
        lost = "unknown" if o.rows_lost is None else f"{o.rows_lost:,}"
        # Reasons name [[evidence]] entries and patterns: text, not console markup.
        table.add_row(
            escape(o.path), o.kind, f"[red]{o.outcome}[/red]", lost, escape(o.reason or "")
        )
    console.print(table)
    console.print(
        f"The evidence is incomplete: {len(problems)} of the files and patterns above did not "
        "load whole (`forensics ingest` says why, one line each).",
        highlight=False,
    )
