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


class OrderedGroups:
    """A query's rows, ordered by a key, handed out one key at a time as they stream.

    The first ``width`` columns are the key. Ask for keys in the query's own order, and only
    for keys the query was filtered to: a key with no rows gets none. Memory holds one batch
    and one key's rows, however many rows the query returns.

    >>> import duckdb
    >>> cur = duckdb.connect().execute(
    ...     "SELECT * FROM (VALUES ('a', 1), ('a', 2), ('c', 3)) t(k, v) ORDER BY k, v")
    >>> groups = OrderedGroups(cur, batch=1)
    >>> groups.take(("a",)), groups.take(("b",)), groups.take(("c",))
    ([{'v': 1}, {'v': 2}], [], [{'v': 3}])
    """

    def __init__(self, cur: Any, width: int = 1, batch: int = 10_000):
        self._cur, self._width, self._batch = cur, width, batch
        self._names = [d[0] for d in cur.description][width:]
        self._buffer: list[tuple] = []
        self._done = False

    def _peek(self) -> tuple | None:
        if not self._buffer and not self._done:
            self._buffer = list(reversed(self._cur.fetchmany(self._batch)))
            self._done = not self._buffer
        return self._buffer[-1] if self._buffer else None

    def take(self, key: tuple) -> list[dict]:
        """Every row of ``key`` (its key columns left out).

        A row whose key comes before ``key`` could never be taken again: the rows are not in
        the query's order (or keys were asked out of order), and that is an error, never rows
        silently left out.

        >>> import duckdb
        >>> cur = duckdb.connect().execute("SELECT * FROM (VALUES ('b', 1), ('a', 2)) t(k, v)")
        >>> OrderedGroups(cur).take(("b",))
        Traceback (most recent call last):
        ...
        RuntimeError: rows out of order: key ('a',) came after ('b',) was asked for
        """
        out = []
        while (row := self._peek()) is not None and tuple(row[: self._width]) == key:
            self._buffer.pop()
            out.append(dict(zip(self._names, row[self._width :], strict=True)))
        if row is not None and tuple(row[: self._width]) < key:
            raise RuntimeError(
                f"rows out of order: key {tuple(row[: self._width])} came after {key} was asked for"
            )
        return out
