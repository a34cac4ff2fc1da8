"""The case database: one DuckDB file per case, created with the canonical schema on first use.

It holds every customer's evidence: a new database file is created 0600 (less if the umask
says so). DuckDB's own files beside it (the write-ahead log ``<db>.wal``, spilled data in
``<db>.tmp/``) follow the process umask, which the command line makes private.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.case import check_memory_limit, memory_bytes
from forensics.errors import ForensicsError, ResourceError
from forensics.schema import FINDINGS_DDL, SCOPE_DDL, all_ddl
from forensics.sql import run_sql_file, scalar
from forensics.verdicts import vocabulary_macros

if TYPE_CHECKING:
    import duckdb


# A DuckDB memory size: "1GB", "512 MiB", "1.5GB" (B, KB, MB, GB, TB and the KiB family).
def memory_error(exc: Exception, where: str | None = None) -> ResourceError:
    """One line for DuckDB running out of memory under its limit: what happened (and while
    loading which file, ``where``), and what to do.

    Above the default limit a larger one is not always the cure: DuckDB plans in memory the
    work it expects to fit and may then be unable to spill it. Detecting 100M requests under
    11.7 GB stopped so in the decode timeline's join, where 2 GB completes; the line says so.

    >>> str(memory_error(Exception("failed to pin block (1.9 MiB/1.9 MiB used)")))[-28:]
    'pass a larger --memory-limit'
    >>> str(memory_error(Exception("failed to pin block (11.7 GiB/11.7 GiB used)")))[-33:]
    'complete where a larger one fails'
    """
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    prefix = f"{where}: " if where else ""
    advice = "raise [database].memory_limit in the manifest or pass a larger --memory-limit"
    # DuckDB states the limit it ran under ("(11.7 GiB/11.7 GiB used)"), to one decimal: a
    # tenth over the default is above it.
    used = re.search(r"/\s*([0-9.]+\s*[KMGT]iB) used", first)
    if used and memory_bytes(used.group(1)) > 1.1 * memory_bytes(DEFAULT_MEMORY_LIMIT):
        default = DEFAULT_MEMORY_LIMIT
        advice = (
            f"the limit is above {default}, where DuckDB plans in memory what it expects to fit"
            f" and may then not spill it: a smaller one such as {default}"
            " ([database].memory_limit in the manifest or --memory-limit) can complete where a"
            " larger one fails"
        )
    return ResourceError(
        f"{prefix}out of memory under the database memory limit ({first}); {advice}"
    )


# Without a limit DuckDB keeps its working tables in memory up to 80 % of RAM: detecting 2M
# requests peaked at 4.4 GB. Spilling past 2 GB cost nothing measurable there (36.1 s and
# 36.6 s, 2.3 GB peak), so a case database gets this limit unless the manifest or a flag says
# otherwise; work that cannot spill fails with memory_error's one line, never a kill.
DEFAULT_MEMORY_LIMIT = "2GB"
# A database file of LARGE_CASE_BYTES or more (some 12M requests and up) gets LARGE_CASE_LIMIT:
# detection's working tables grow with the case, and under 2 GB every large join and sort of
# the 16M case spilled (62-66 s under 3 GB against 72-75 s under 2 GB). No more than that, and never
# above a quarter of the machine's memory: 100M requests under 11.7 GB stopped out of memory
# where DuckDB planned a join to fit and could not spill it (under 3 GB they complete, 879 s
# against 851 s under 2 GB: at that size everything spills either way).
LARGE_CASE_BYTES = 3 * 1000**3
LARGE_CASE_LIMIT = "3GB"


def default_memory_limit(path: str | Path) -> str:
    """The memory limit a case database at ``path`` gets when neither the manifest nor a flag
    gives one: ``DEFAULT_MEMORY_LIMIT``, or ``LARGE_CASE_LIMIT`` for a database file of at
    least ``LARGE_CASE_BYTES`` on a machine with four times that memory.

    >>> default_memory_limit("/nonexistent/case.duckdb")
    '2GB'
    """
    import os

    try:
        size = Path(path).stat().st_size
    except OSError:
        return DEFAULT_MEMORY_LIMIT
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return DEFAULT_MEMORY_LIMIT
    if size >= LARGE_CASE_BYTES and memory >= 4 * memory_bytes(LARGE_CASE_LIMIT):
        return LARGE_CASE_LIMIT
    return DEFAULT_MEMORY_LIMIT


def connect(
    path: str | Path, read_only: bool = False, *, memory_limit: str | None = None
) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) a case database with every canonical table present.

    Sessions run in UTC so that TIMESTAMPTZ values print and compare in UTC everywhere.
    ``":memory:"`` gives an in-memory case (tests, docstrings). ``memory_limit`` (e.g.
    ``"1GB"``, default :func:`default_memory_limit` for a database file) caps DuckDB's memory;
    work beyond it spills to ``<db>.tmp/`` beside the database, and what cannot spill fails
    with :func:`memory_error`'s message.

    >>> con = connect(":memory:")
    >>> con.execute("SELECT count(*) FROM requests").fetchone()
    (0,)

    Raises:
        ForensicsError: the database is in use by another process, or cannot be opened.
    """
    import duckdb

    from forensics.files import make_private, private_dirs

    created = False
    if str(path) != ":memory:":
        private_dirs(Path(path).parent)
        created = not Path(path).exists()
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        first = str(exc).strip().splitlines()[0]
        if "lock" in first.lower():
            # Two processes cannot write one case database: the second one stops, loudly.
            pid = re.search(r"PID ([0-9]+)", first)
            who = f" (process {pid.group(1)})" if pid else ""
            raise ForensicsError(
                f"{path}: the case database is in use by another process{who}; "
                "wait for it to finish (one command at a time on a case)"
            ) from None
        raise ForensicsError(f"{path}: cannot open the case database ({first})") from None
    if created:
        make_private(Path(path))
    if memory_limit is None and str(path) != ":memory:":
        memory_limit = default_memory_limit(path)
    if memory_limit is not None:
        con.execute(f"SET memory_limit = '{check_memory_limit(memory_limit)}'")
    if str(path) != ":memory:" and not read_only:
        # Spilled data goes beside the database (DuckDB's own default, stated so it holds).
        spill = str(Path(path)) + ".tmp"
        con.execute(f"SET temp_directory = '{spill.replace(chr(39), chr(39) * 2)}'")
    con.execute("SET TimeZone = 'UTC'")
    # DuckDB merges a table's small row groups (one per file loaded) at the first checkpoint
    # that follows any change: after an ingest of 2M requests, the first detection's commit
    # spent 3.8 s rewriting both big tables for it. Scans do not need it; it is not done.
    con.execute("SET max_vacuum_tasks = 0")
    if not read_only:
        for stmt in all_ddl():
            con.execute(stmt)
    install_macros(con)
    return con


def install_macros(con: duckdb.DuckDBPyConnection) -> None:
    """Create the shared rules (the verdict vocabulary and ``sql/rules.sql``) on a connection;
    they are temporary, so every connection and cursor needs its own."""
    for macro in vocabulary_macros():
        con.execute(macro)
    run_sql_file(con, "rules.sql")


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A second connection to the same case database, with the shared rules, for a result
    that streams while the first connection runs other queries."""
    dup = con.cursor()
    dup.execute("SET TimeZone = 'UTC'")
    install_macros(dup)
    return dup


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Run a block as one transaction: all of its writes or none (a kill, an error)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def publish_findings(con: duckdb.DuckDBPyConnection) -> None:
    """Copy the findings and scope detection wrote (temporary tables of ``con``) into the case
    database in one transaction, replacing the previous ones whole; a scope table detection
    did not write is dropped (it described earlier findings). The temporary tables go after.

    Raises:
        RuntimeError: detection has not written its findings on this connection.
    """
    staged = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp'"
        ).fetchall()
    }
    missing = sorted(set(FINDINGS_DDL) - staged)
    if missing:  # nothing to publish: replacing the findings now would erase them
        raise RuntimeError(f"no findings to publish ({', '.join(missing)} not written)")
    name = scalar(con, "SELECT current_database()")
    # Qualified by database: `main.findings_x` would name the temporary table.
    database = '"' + name.replace('"', '""') + '"'
    with transaction(con):
        for table in [*FINDINGS_DDL, *SCOPE_DDL]:
            if table in staged:
                con.execute(f"CREATE OR REPLACE TABLE {database}.main.{table} AS FROM temp.{table}")
            else:
                con.execute(f"DROP TABLE IF EXISTS {database}.main.{table}")
    for table in staged & {*FINDINGS_DDL, *SCOPE_DDL}:
        con.execute(f"DROP TABLE temp.{table}")


def open_case(
    case_path: str | Path,
    memory_limit: str | None = None,
    *,
    read_only: bool = False,
    create: bool = False,
):
    """Load a manifest and open its existing case database; returns ``(case, connection)``.

    ``memory_limit`` overrides the manifest's ``[database].memory_limit``; ``read_only`` opens
    it for reading only (the report: nothing it does can change the evidence or findings);
    ``create`` makes it when there is none yet (a detection that reads the evidence in place
    has no ingest before it).

    Raises:
        ForensicsError: the manifest is invalid, or nothing has been ingested for it yet.
    """
    from dataclasses import replace

    from forensics.case import load_case

    case = load_case(case_path)
    if memory_limit is not None:
        case = replace(case, memory_limit=memory_limit)
    if not case.database.exists() and not create:
        raise ForensicsError(
            f"{case.database}: no case database yet; run `forensics ingest {case_path}`"
            f" (or `forensics run {case_path}`) first"
        )
    return case, connect(case.database, read_only, memory_limit=case.memory_limit)


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


def in_place_note(case) -> str | None:
    """For a case whose evidence was read in place by Spark: what its large tables hold here
    (only the rows behind the findings), as one line; None for any other case."""
    if not case.database.exists():
        return None
    con = connect(case.database, read_only=True)
    try:
        lying = con.execute(
            "SELECT kind, rows_loaded FROM evidence_in_place ORDER BY kind"
        ).fetchall()
        if not lying:
            return None
        parts = []
        for kind, total in lying:
            here = scalar(con, f"SELECT count(*) FROM {kind}")  # noqa: S608 - fixed names
            parts.append(f"{kind} {here:,} of {total:,}")
    finally:
        con.close()
    return (
        "note: this case's evidence was read in place by Spark; requests, engine_legs and "
        "kv_allocations hold only the rows behind its findings here (" + ", ".join(parts) + ")"
    )


def query_case(case, query: str, limit: int) -> tuple[list[str], list[tuple], int]:
    """Run one statement on a case database opened read-only: (columns, first rows, row count).

    Read-only, so an ad-hoc question can never change the evidence or the findings.

    Raises:
        ForensicsError: no database yet, or the statement fails (DuckDB's message, one line).
    """
    import duckdb

    from forensics.errors import ForensicsError

    if not case.database.exists():
        raise ForensicsError(
            f"{case.database}: no case database yet; run `forensics ingest {case.folder}`"
            f" (or `forensics run {case.folder}`) first"
        )
    con = connect(case.database, read_only=True)
    try:
        try:
            cur = con.execute(query)
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0]
            raise ForensicsError(f"query failed: {first}") from None
        if cur.description is None:
            return [], [], 0
        names = [d[0] for d in cur.description]
        rows = cur.fetchmany(limit)
        total = len(rows) + len(cur.fetchall()) if len(rows) == limit else len(rows)
        return names, rows, total
    finally:
        con.close()
