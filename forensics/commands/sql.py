"""``forensics sql``: an ad-hoc question to a case database, read-only."""

from __future__ import annotations

from pathlib import Path

import typer

from forensics.cli import app, handle_errors


@app.command()
@handle_errors
def sql(
    case_path: Path = typer.Argument(..., help="The case folder or its case.toml."),
    query: str = typer.Argument(
        ..., help='One SQL statement, e.g. "SELECT * FROM findings_review".'
    ),
    csv_out: bool = typer.Option(False, "--csv", help="Print CSV instead of a table."),
    limit: int = typer.Option(1000, "--limit", min=1, help="Most rows to print."),
) -> None:
    """Run one read-only SQL query on the case database (tables: see docs/architecture.md)."""
    from forensics.case import load_case
    from forensics.db import query_case

    case = load_case(case_path)
    names, rows, total = query_case(case, query, limit)
    if csv_out:
        import csv
        import sys

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(rows)
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(*[escape(n) for n in names])
        for row in rows:
            table.add_row(*[escape("" if v is None else str(v)) for v in row])
        Console().print(table)
    if total > len(rows):
        typer.echo(f"({len(rows):,} of {total:,} rows shown; raise --limit for more)", err=True)
