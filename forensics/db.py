"""The case database: one DuckDB file per case, created with the canonical schema on first use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forensics.schema import all_ddl

if TYPE_CHECKING:
    import duckdb


def connect(path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) a case database with every canonical table present.

    Sessions run in UTC so that TIMESTAMPTZ values print and compare in UTC everywhere.
    ``":memory:"`` gives an in-memory case (tests, docstrings).

    >>> con = connect(":memory:")
    >>> con.execute("SELECT count(*) FROM requests").fetchone()
    (0,)
    """
    import duckdb

    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path), read_only=read_only)
    con.execute("SET TimeZone = 'UTC'")
    if not read_only:
        for stmt in all_ddl():
            con.execute(stmt)
    return con
