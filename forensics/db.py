"""The case database: one DuckDB file per case, created with the canonical schema on first use.

It holds every customer's evidence: a new database file is created 0600 (less if the umask
says so). DuckDB's own files beside it (the write-ahead log ``<db>.wal``, spilled data in
``<db>.tmp/``) follow the process umask, which the command line makes private.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forensics.schema import all_ddl
from forensics.verdicts import vocabulary_macros

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

    from forensics.files import make_private, private_dirs

    created = False
    if str(path) != ":memory:":
        private_dirs(Path(path).parent)
        created = not Path(path).exists()
    con = duckdb.connect(str(path), read_only=read_only)
    if created:
        make_private(Path(path))
    con.execute("SET TimeZone = 'UTC'")
    if not read_only:
        for stmt in all_ddl():
            con.execute(stmt)
    for macro in vocabulary_macros():
        con.execute(macro)
    return con


def open_case(case_path: str | Path):
    """Load a manifest and open its existing case database; returns ``(case, connection)``.

    Raises:
        ForensicsError: the manifest is invalid, or nothing has been ingested for it yet.
    """
    from forensics.case import load_case
    from forensics.errors import ForensicsError

    case = load_case(case_path)
    if not case.database.exists():
        raise ForensicsError(
            f"{case.database}: no case database yet; run `forensics ingest {case_path}`"
            f" (or `forensics run {case_path}`) first"
        )
    return case, connect(case.database)


def insert_rows(con: duckdb.DuckDBPyConnection, kind: str, rows: list[dict], evidence_id: int = 0):
    """Insert canonical rows given as dicts (fixtures, detector test cases, docstrings).

    Values are cast by the table's column types; timestamps may be RFC 3339 strings. Each row's
    ``source_row`` is its 1-based position. Not for evidence files: use ``forensics ingest``.

    >>> con = connect(":memory:")
    >>> insert_rows(con, "tenants", [{"tenant_id": "acct_a", "name": "A"}])
    >>> con.execute("SELECT tenant_id, source_row FROM tenants").fetchall()
    [('acct_a', 1)]
    """
    from forensics.schema import SQL_TYPE, columns

    cols = columns(kind)
    known = {c.name for c in cols}
    names = ", ".join(f'"{c.name}"' for c in cols)
    values = ", ".join(f"CAST(${c.name} AS {SQL_TYPE[c.type]})" for c in cols)
    sql = (
        f"INSERT INTO {kind} ({names}, extra, evidence_id, source_row) "
        f"VALUES ({values}, $extra, $evidence_id, $source_row)"
    )
    import json

    for i, row in enumerate(rows, start=1):
        unknown = {k: v for k, v in row.items() if k not in known}
        args = {c.name: row.get(c.name) for c in cols}
        args |= {
            "extra": json.dumps(unknown) if unknown else None,
            "evidence_id": evidence_id,
            "source_row": i,
        }
        con.execute(sql, args)
