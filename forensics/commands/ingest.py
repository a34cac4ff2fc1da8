"""``forensics ingest`` and ``forensics status``: load evidence, show what is loaded."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from forensics.app import CASE_ARG, MEMORY_OPT, app, error, handle_errors
from forensics.case import ROLES
from forensics.ingest import SUPPORTED_FORMATS
from forensics.schema import KINDS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from forensics.ingest import IngestResult, StatusReport

# Choices built from the data they list; mypy cannot see members of an enum made this way.
Kind = StrEnum("Kind", {k: k for k in KINDS})  # type: ignore[misc]
# The formats ingest reads today (the manifest also names adapters still to come): anything
# else is a usage error that lists these.
Format = StrEnum("Format", {f: f for f in SUPPORTED_FORMATS})  # type: ignore[misc]
DEFAULT_FORMAT = Format("canonical")
Role = StrEnum("Role", {r: r for r in ROLES})  # type: ignore[misc]


def is_case(target: str) -> bool:
    """A case folder or a manifest (the manifest form), not a database (the file form)."""
    return target.endswith(".toml") or Path(target).is_dir()


def is_database(path: Path) -> bool:
    """Whether an existing file is a DuckDB database (its header says DUCK at byte 8).

    DuckDB opens some other files too (a JSON Lines file, as a read-only view of itself), so
    an evidence file given where the database goes would "load" into nothing.
    """
    try:
        with path.open("rb") as fh:
            return fh.read(12)[8:12] == b"DUCK"
    except OSError:
        return False


@app.command()
def ingest(
    target: str = typer.Argument(
        ...,
        metavar="CASE|DB",
        help="The case folder or its case.toml; or, to load files by name, the case database.",
        show_default=False,
    ),
    files: list[str] = typer.Argument(
        None,
        metavar="FILE",
        help="Evidence files or globs (with a database only).",
        show_default=False,
    ),
    kind: Kind | None = typer.Option(
        None,
        "--kind",
        help="Evidence kind of the files (with a database only).",
        show_default=False,
    ),
    fmt: Format = typer.Option(
        DEFAULT_FORMAT, "--format", help="Evidence format of the files (with a database only)."
    ),
    timezone: str = typer.Option(
        "UTC",
        "--timezone",
        metavar="ZONE",
        help="Zone of timestamps without an offset (with a database only).",
    ),
    memory_limit: str | None = MEMORY_OPT,
    node: str | None = typer.Option(
        None,
        "--node",
        help="Engine node of files that do not name it (with a database only).",
        show_default=False,
    ),
    role: Role | None = typer.Option(
        None, "--role", help="Engine role of the files (with a database only).", show_default=False
    ),
    tenant_field: str | None = typer.Option(
        None,
        "--tenant-field",
        metavar="NAME",
        help="Field, attribute or label holding the tenant (with a database only).",
        show_default=False,
    ),
) -> None:
    """Load a case's evidence, or files by name into a database.

    `forensics ingest CASE` loads what the manifest lists; `forensics ingest DB FILE...
    --kind KIND` loads files of one kind into a case database.
    """
    entry = {"node": node, "role": role.value if role else None, "tenant_field": tenant_field}
    if is_case(target):
        if any(entry.values()):
            raise typer.BadParameter(
                "with a case, --node, --role and --tenant-field come from its [[evidence]] entries",
                param_hint="--node",
            )
        if files or kind is not None:
            raise typer.BadParameter(
                "with a case, files and --kind come from its [[evidence]] entries",
                param_hint="FILE",
            )
    else:
        if not files:
            raise typer.BadParameter(
                "give a case folder or case.toml, or a database followed by evidence files",
                param_hint="FILE",
            )
        if kind is None:
            raise typer.BadParameter("loading files by name needs --kind", param_hint="--kind")
        if Path(target).is_file() and not is_database(Path(target)):
            raise typer.BadParameter(
                f"{target} is not a case database (an evidence file? the database comes first: "
                "`forensics ingest DB FILE... --kind KIND`)",
                param_hint="CASE|DB",
            )
    _ingest(
        target, files or [], kind.value if kind else None, fmt.value, timezone, memory_limit, entry
    )


@handle_errors
def _ingest(
    target: str,
    files: list[str],
    kind: str | None,
    fmt: str,
    timezone: str,
    memory_limit: str | None = None,
    entry: dict[str, str | None] | None = None,
) -> None:
    from forensics.case import Evidence, load_case
    from forensics.errors import ForensicsError
    from forensics.ingest import ingest_case, ingest_paths
    from forensics.terminal import Steps, make_console

    if kind is None:
        case = load_case(target)
        if case.engine.in_place:
            raise ForensicsError(
                'this case reads its evidence in place on Spark ([engine] evidence = "in-place"):'
                " forensics run or forensics detect read it where it lies; nothing is loaded here"
            )
        if memory_limit is not None:
            from dataclasses import replace

            case = replace(case, memory_limit=memory_limit)
        count = sum(len(entry.files()) for entry in case.evidence)
        with Steps(make_console(stderr=True), files=count) as steps:
            result = ingest_case(case, progress=steps.file)
        where = case.database
    else:
        where = Path(target)
        # A mistyped path must not become a tree of new folders holding a new database.
        if not where.parent.is_dir():
            raise ForensicsError(f"{where}: no folder {where.parent} to create the database in")
        found = [f for p in files for f in Evidence(kind=kind, format=fmt, paths=(p,)).files()]
        with Steps(make_console(stderr=True), files=len(dict.fromkeys(found))) as steps:
            result = ingest_paths(
                target,
                files,
                kind,
                fmt,
                timezone,
                progress=steps.file,
                memory_limit=memory_limit,
                **(entry or {}),
            )
    _summary(make_console(), result, where, case_mode=kind is None)
    # Everything else has loaded by now; evidence that did not load whole is an error.
    problems = result.problems
    for line in problems:
        error(line)
    if problems:
        raise typer.Exit(1)


def version_lines(result: IngestResult) -> list[str]:
    """One line per file loaded now whose path already held other content in the case."""
    return [
        f"{f.path}: loaded before with other content (sha256 {sha[:12]}); both versions are "
        "in the case now: an event both tell alike counts once, one told differently is "
        "rejected as a conflicting duplicate, or kept twice if its time changed. If the file "
        "was replaced rather than extended, load the evidence into a new case database."
        for f in result.files
        if not f.skipped
        for sha in f.earlier
    ]


def _summary(console: Console, result: IngestResult, where: Path, case_mode: bool) -> None:
    from forensics.terminal import Col, Grid, plural, shown, styled

    formats = {f.format for f in result.files} | {f.format for f in result.failures}
    adapted = bool(formats - {"canonical"})
    grid = Grid(
        f"Evidence loaded into {shown(where)}",
        [
            Col("file"),
            Col("kind"),
            # The format each file was read in (auto's choice among them) once any is not
            # canonical: a canonical-only ingest reads as it always has.
            *([Col("format")] if adapted else []),
            Col("read", right=True),
            Col("loaded", right=True),
            Col("rejected", right=True),
            Col("status"),
        ],
    )
    for f in result.files:
        status = styled("already loaded" if f.skipped else "loaded")
        if f.rows_rejected and not f.skipped:
            status = styled("loaded, with rejects")
        if f.outcome == "partial":
            status = styled(("PARTIAL", "red"), " (already loaded)" if f.skipped else "")
        counts = (f"{f.rows_read:,}", f"{f.rows_loaded:,}", f"{f.rows_rejected:,}")
        grid.add_row(f.path, f.kind, *([f.format] if adapted else []), *counts, status)
    for failure in result.failures:
        failed = "NO FILE" if failure.outcome == "missing" else "FAILED"
        shown_format = [failure.format] if adapted else []
        grid.add_row(
            failure.path, failure.kind, *shown_format, "-", "-", "-", styled((failed, "red"))
        )
    grid.print(console)
    # Problems are named only when there are some, so a clean ingest reads as it always has.
    more = ""
    if result.files_partial:
        more += f", {result.files_partial} partial"
    if result.patterns_missing:
        more += f", {plural(result.patterns_missing, 'pattern')} matching no file"
    skipped = " (same sha256, skipped)" if result.files_skipped else ""
    rows = (
        f"rows read {result.rows_read:,}, loaded {result.rows_loaded:,}, "
        f"rejected {result.rows_rejected:,}"
        if result.files_loaded
        else "no new rows"
    )
    console.print(
        f"{result.files_loaded} loaded, {result.files_skipped} already loaded{skipped}, "
        f"{result.files_failed} failed{more}; {rows}"
    )
    if result.duplicates or result.conflicts:
        # Rejected, never loaded twice; said here because a repeated event is a finding itself.
        console.print(
            f"Duplicates rejected: {plural(result.duplicates, 'exact duplicate')} of rows "
            f"already loaded (the same event in overlapping files), "
            f"{plural(result.conflicts, 'conflicting duplicate')} (an event already loaded, "
            "with different content: a retry logged twice, a replayed or edited log)."
        )
    for f in result.files:
        for sha in f.replaced:
            console.print(
                f"{f.path}: loaded whole; replaces its earlier partial load (sha256 {sha[:12]})"
            )
    for line in version_lines(result):
        console.print(styled(("warning: ", "yellow"), line))
    if result.rows_rejected:
        if case_mode:
            console.print("Rejected rows are in the rejects table: see `forensics status`.")
        else:
            # status and sql read a case; a database loaded by name is asked directly.
            console.print(
                f"Rejected rows are in the rejects table of {shown(where)} (columns "
                "path, source_row, column_name, reason, raw)."
            )


@app.command()
@handle_errors
def status(
    case_path: Path = CASE_ARG,
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON for scripts (the shape is in the README)."
    ),
) -> None:
    """Show the evidence loaded: files, rows, rejects, time span.

    Each file with its sha256, rows and rejects, what did not load whole, the time each kind
    of evidence spans and the rejected rows by reason.
    """
    from forensics.case import load_case
    from forensics.db import connect
    from forensics.errors import ForensicsError
    from forensics.ingest import evidence_status
    from forensics.terminal import make_console

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
    if as_json:
        import json

        typer.echo(json.dumps(status_json(report, case.database), indent=2))
        return
    _print_status(make_console(), report, case.database)
    from forensics.db import in_place_note

    note = in_place_note(case)
    if note:
        typer.echo(note)


def status_json(report: StatusReport, where: Path) -> dict[str, Any]:
    """``forensics status --json``: every key always present, null where a value is unknown or
    does not apply, timestamps RFC 3339 in UTC. The evidence list is
    :func:`forensics.status.evidence_outcomes`, in its order."""
    from forensics.report.data import iso

    def when(value) -> str | None:
        return iso(value) or None

    return {
        "database": str(where),
        "complete": not report.problems,
        "evidence": [
            {
                "path": o.path,
                "kind": o.kind,
                "format": o.format,
                "outcome": o.outcome,
                "reason": o.reason,
                "rows_lost": o.rows_lost,
                "sha256": o.sha256,
                "bytes": o.bytes,
                "rows_read": o.rows_read,
                "rows_loaded": o.rows_loaded,
                "rows_rejected": o.rows_rejected,
                "first_at": when(o.first_at),
                "last_at": when(o.last_at),
                "entry": o.entry,
            }
            for o in report.outcomes
        ],
        "totals": {
            "files": len(report.files),
            "bytes": report.bytes,
            "rows_read": report.rows_read,
            "rows_loaded": report.rows_loaded,
            "rows_rejected": report.rows_rejected,
        },
        "spans": [
            {
                "kind": s.kind,
                "files": s.files,
                "rows": s.rows,
                "first_at": when(s.first_at),
                "last_at": when(s.last_at),
            }
            for s in report.spans
        ],
        "rejects": [
            {
                "kind": r.kind,
                "column": r.column,
                "reason": r.reason,
                "rows": r.rows,
                "example": r.example,
            }
            for r in report.rejects
        ],
    }


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _print_status(console: Console, report: StatusReport, where: Path) -> None:
    from forensics.terminal import Col, Grid, shown, styled

    if not report.files:
        console.print(f"No evidence loaded in {shown(where)} yet.")
        _print_problems(console, report)
        return
    # One format for every file (the usual case) is said once, in the title.
    formats = sorted({f.format for f in report.files})
    title = f"Evidence in {shown(where)}" + (f" (format {formats[0]})" if len(formats) == 1 else "")
    columns = [Col("path"), Col("kind")]
    columns += [Col("format")] if len(formats) > 1 else []
    columns += [
        Col("sha256"),
        Col("rows", right=True),
        Col("rejects", right=True),
        Col("first (UTC)", wrap=True),
        Col("last (UTC)", wrap=True),
        Col("outcome"),
    ]
    files = Grid(title, columns)
    for f in report.files:
        cells: list[str | Text] = [f.path, f.kind]
        cells += [f.format] if len(formats) > 1 else []
        outcome = styled((f.outcome, "red")) if f.outcome == "partial" else styled(f.outcome)
        cells += [
            f.sha256[:12],
            f"{f.rows_loaded:,}",
            f"{f.rows_rejected:,}",
            _when(f.first_at),
            _when(f.last_at),
            outcome,
        ]
        files.add_row(*cells)
    files.print(console)
    console.print(
        f"Total: {len(report.files)} files, {report.bytes:,} bytes, rows read "
        f"{report.rows_read:,}, loaded {report.rows_loaded:,}, rejected {report.rows_rejected:,}"
    )
    _print_problems(console, report)
    spans = Grid(
        "Time span per kind",
        [
            Col("kind"),
            Col("files", right=True),
            Col("rows", right=True),
            Col("first (UTC)", wrap=True),
            Col("last (UTC)", wrap=True),
        ],
    )
    for s in report.spans:
        spans.add_row(s.kind, str(s.files), f"{s.rows:,}", _when(s.first_at), _when(s.last_at))
    spans.print(console)
    if not report.rejects:
        console.print("No rejected rows.")
        return
    rejects = Grid(
        "Rejected rows by reason",
        [
            Col("kind"),
            Col("column"),
            Col("reason", wrap=True),
            Col("rows", right=True),
            Col("first example", wrap=True),
        ],
    )
    for r in report.rejects:
        rejects.add_row(r.kind, r.column or "-", r.reason, f"{r.rows:,}", r.example)
    rejects.print(console)


def _print_problems(console: Console, report: StatusReport) -> None:
    """The evidence that did not load whole: partial files, failed files, empty patterns."""
    from forensics.terminal import Col, Grid, styled

    problems = report.problems
    if not problems:
        return
    grid = Grid(
        "Evidence that did not load whole",
        [
            Col("path or pattern"),
            Col("kind"),
            Col("outcome"),
            Col("rows lost", right=True),
            Col("reason", wrap=True),
        ],
    )
    for o in problems:
        lost = "unknown" if o.rows_lost is None else f"{o.rows_lost:,}"
        grid.add_row(o.path, o.kind, styled((o.outcome, "red")), lost, o.reason or "")
    grid.print(console)
    console.print(
        f"The evidence is incomplete: {len(problems)} of the files and patterns above did not "
        "load whole (`forensics ingest` says why, one line each)."
    )
