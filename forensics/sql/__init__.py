"""The working SQL of the pipeline (``*.sql`` beside this file) and the one way to run it.

Detectors live in ``queries/``; the files here are the pipeline's own steps (working views,
verdicts, attribution timelines, coverage, exploitation) and the rules every step shares
(``rules.sql``: DuckDB macros such as the SGLang input limit or time to first token).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

SQL_DIR = Path(__file__).resolve().parent


def run_sql(
    con: duckdb.DuckDBPyConnection, text: str, values: dict[str, Any] | None = None
) -> None:
    """Run each statement of ``text``, binding the named parameters each one uses.

    DuckDB splits the statements and names their parameters, so a statement only receives the
    values it asks for (an unused value would be an error).

    >>> import duckdb
    >>> con = duckdb.connect()
    >>> run_sql(con, "CREATE TABLE t AS SELECT $a AS a; INSERT INTO t SELECT $b;", {"a": 1, "b": 2})
    >>> con.sql("SELECT a FROM t ORDER BY a").fetchall()
    [(1,), (2,)]
    """
    values = values or {}
    for statement in con.extract_statements(text):
        con.execute(statement.query, {k: values.get(k) for k in statement.named_parameters})


def run_sql_file(
    con: duckdb.DuckDBPyConnection, name: str | Path, values: dict[str, Any] | None = None
) -> None:
    """Run a SQL file of this folder (by name, e.g. ``"prepare.sql"``) or at a path."""
    path = SQL_DIR / name if isinstance(name, str) else name
    run_sql(con, path.read_text(encoding="utf-8"), values)


def first_row(
    con: duckdb.DuckDBPyConnection, query: str, values: dict[str, Any] | list | None = None
) -> tuple:
    """The first row of a query that always returns one (an aggregate, ``nextval``).

    >>> import duckdb
    >>> first_row(duckdb.connect(), "SELECT 1, 'a'")
    (1, 'a')
    """
    row = con.execute(query, values).fetchone()
    if row is None:  # an aggregate always returns a row: this is a bug in the query
        raise RuntimeError(f"query returned no row: {query.strip().splitlines()[0]}")
    return row


def scalar(
    con: duckdb.DuckDBPyConnection, query: str, values: dict[str, Any] | list | None = None
) -> Any:
    """The single value of a query that always returns one row.

    >>> import duckdb
    >>> scalar(duckdb.connect(), "SELECT count(*) FROM range(5)")
    5
    """
    return first_row(con, query, values)[0]
