"""``forensics sql``: an ad-hoc question to a case database, read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from forensics.app import CASE_ARG, app, handle_errors


@app.command()
@handle_errors
def sql(
    case_path: Path = CASE_ARG,
    query: str = typer.Argument(
        ...,
        metavar="QUERY",
        help='One SQL statement, e.g. "SELECT * FROM findings_review".',
        show_default=False,
    ),
    csv_out: bool = typer.Option(False, "--csv", help="Print CSV instead of a table."),
    limit: int = typer.Option(1000, "--limit", metavar="N", min=1, help="Most rows to print."),
) -> None:
    """Ask the case database one read-only SQL question.

    The tables and their columns are described in docs/architecture.md.
    """
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
        from forensics.terminal import Col, Grid, make_console

        # Numbers line up on the right; text may wrap between words, never inside one.
        numeric = [
            bool(rows) and all(_is_number(r[i]) for r in rows if r[i] is not None)
            for i in range(len(names))
        ]
        columns = [Col(n, right=num, wrap=not num) for n, num in zip(names, numeric, strict=True)]
        grid = Grid("", columns)
        for row in rows:
            grid.add_row(*[_cell(v) for v in row])
        console = make_console()
        grid.print(console)
        if not rows:
            console.print("No rows.")
    if total > len(rows):
        typer.echo(f"({len(rows):,} of {total:,} rows shown; raise --limit for more)", err=True)
    import re

    if re.search(r"\b(requests|engine_legs|kv_allocations)\b", query, re.IGNORECASE):
        from forensics.db import in_place_note

        # A count of what lies elsewhere must not read as a count of the case.
        note = in_place_note(case)
        if note:
            typer.echo(note, err=True)


def _is_number(value: Any) -> bool:
    from decimal import Decimal

    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _cell(value: Any):
    """A value as the table shows it: numbers as they are (ids and epochs copy whole), instants
    in UTC with Z, NULL as such (an empty cell could be an empty string)."""
    from datetime import datetime

    from forensics.terminal import styled, utc

    if value is None:
        return styled(("NULL", "dim"))
    if isinstance(value, datetime) and value.tzinfo is not None:
        return utc(value)
    return str(value)
