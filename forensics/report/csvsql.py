"""The large CSV outputs, written line by line by the database.

Affected responses, exposures and the notices' request lists grow with the incident: hundreds
of thousands of rows at a few million requests. Formatting them cell by cell in Python (a dict
per row, a timestamp formatted per cell, the csv module per row) took most of a report's time.
Here each line is made in SQL, so Python only joins ready lines in batches.

A cell is what :func:`forensics.report.outputs.csv_cell` and the csv module make of a value
(the tests hold the two to the same bytes): NULL is empty; a timestamp is UTC ISO 8601 with
``Z`` and as many sub-second digits as :func:`forensics.report.data.iso` writes; text that
begins like a spreadsheet formula gets a leading single quote unless it is a number; a cell
holding a comma, a double quote or a newline is quoted, its quotes doubled (as the csv module
does with a newline line terminator: a lone carriage return inside a cell is left as it is, and
one at a cell's start is behind the formula guard's quote).

>>> import duckdb
>>> con = duckdb.connect()
>>> sql = "SELECT * FROM (VALUES (1, '=1+2', 7), (2, 'a,b', NULL)) t(k, name, n)"
>>> print("".join(csv_chunks(con, [("name", "text"), ("n", "int")], sql, "q.k")), end="")
name,n
'=1+2,7
"a,b",
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

    from forensics.report.redact import Redactor

# What a cell holds: text (request ids, verdicts), an integer, a timestamp, or a tenant id,
# which is text that --redact replaces by its pseudonym.
KINDS = ("text", "int", "time", "tenant")

# Lines fetched at a time: memory holds one batch of ready lines.
BATCH_LINES = 10_000

# The first characters a spreadsheet reads as the start of a formula (csv_cell guards them too).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# A number stays a number even when it begins with a sign.
NUMBER = r"[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?"


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _value(col: str, kind: str) -> str:
    """A cell's text before quoting, from a column reference (named more than once here)."""
    if kind in ("text", "tenant"):
        v = f"{col}::VARCHAR"
        starts = " OR ".join(f"starts_with({v}, chr({ord(c)}))" for c in FORMULA_START)
        return (
            f"CASE WHEN ({starts}) AND NOT regexp_full_match({v}, {_lit(NUMBER)}) "
            f"THEN chr(39) || {v} ELSE {v} END"
        )
    if kind == "int":
        return f"{col}::BIGINT::VARCHAR"
    if kind == "time":
        t = f"{col}::TIMESTAMPTZ"
        frac = f"(((epoch_us({t}) % 1000000) + 1000000) % 1000000)"
        return (
            f"strftime(timezone('UTC', {t}), '%Y-%m-%dT%H:%M:%S') || "
            f"CASE WHEN {frac} % 1000 <> 0 THEN '.' || lpad({frac}::VARCHAR, 6, '0') "
            f"WHEN {frac} <> 0 THEN '.' || lpad(({frac} // 1000)::VARCHAR, 3, '0') ELSE '' END"
            " || 'Z'"
        )
    raise ValueError(f"unknown cell kind {kind!r}")


def iso_sql(expr: str) -> str:
    """A timestamp as :func:`forensics.report.data.iso` writes it, in SQL: ``""`` for NULL.

    >>> import duckdb
    >>> sql = "SELECT " + iso_sql("TIMESTAMPTZ '2026-09-08 16:02:00.25+02'")
    >>> duckdb.connect().execute(sql).fetchone()
    ('2026-09-08T14:02:00.250Z',)
    """
    return f"coalesce({_value(f'({expr})', 'time')}, '')"


def _cell(col: str) -> str:
    """A cell from its unquoted text: empty for NULL, quoted when it holds a comma, a double
    quote or a newline."""
    quote = "chr(34)"
    return (
        f"coalesce(CASE WHEN contains({col}, ',') OR contains({col}, {quote}) "
        f"OR contains({col}, chr(10)) "
        f"THEN {quote} || replace({col}, {quote}, {quote} || {quote}) || {quote} "
        f"ELSE {col} END, '')"
    )


def line_sql(cells: Sequence[tuple[str, str]]) -> str:
    """The SQL of one CSV line (newline included) from ``cells``: ``(expression, kind)``
    each, in order (see :data:`KINDS`). Each expression is named twice or more: a column
    reference, or a value computed before this line.

    >>> import duckdb
    >>> sql = "SELECT " + line_sql([("'=x'", "text"), ("NULL", "int"), ("3", "int")])
    >>> duckdb.connect().execute(sql).fetchone()
    ("'=x,,3\\n",)
    """
    return " || ',' || ".join(_cell(_value(e, k)) for e, k in cells) + " || chr(10)"


def lines_sql(
    columns: Sequence[tuple[str, str]], sql: str, order_by: str, pseudonyms: bool = False
) -> str:
    """The SQL of the CSV lines (newline included) of the rows of ``sql``: one column,
    ``line``, in ``order_by`` order.

    ``columns`` are ``(column of sql, kind)``; ``order_by`` names the columns of ``sql`` as
    ``q.<name>``. With ``pseudonyms``, tenant columns are read from ``__kv_pseudonyms``
    (``tenant_id``, ``pseudonym``), which the connection must hold.
    """
    joins, values = [], []
    for i, (name, kind) in enumerate(columns):
        col = f"q.{_ident(name)}"
        if kind == "tenant" and pseudonyms:
            joins.append(f"LEFT JOIN __kv_pseudonyms p{i} ON p{i}.tenant_id = {col}")
            col = f"p{i}.pseudonym"
        values.append(f'{_value(col, kind)} AS "__kv_c{i}"')
    # Each cell's text is computed once, below, and quoted here.
    line = " || ',' || ".join(_cell(f'"__kv_c{i}"') for i in range(len(columns)))
    return (
        f"SELECT {line} || chr(10) AS line FROM (SELECT {', '.join(values)}, "
        f"row_number() OVER (ORDER BY {order_by}) AS __kv_n FROM ({sql}) q {' '.join(joins)}) "
        "ORDER BY __kv_n"
    )


def csv_chunks(
    con: duckdb.DuckDBPyConnection,
    columns: Sequence[tuple[str, str]],
    sql: str,
    order_by: str,
    red: Redactor | None = None,
    every: int | None = None,
) -> Iterator[str]:
    """A header line, then the CSV lines of every row of ``sql`` in chunks of ``every`` rows.

    ``columns`` are ``(name, kind)``: the output's columns, each a column of ``sql`` of that
    kind (see :data:`KINDS`); the rows come in ``order_by`` order (``q.<name>`` for a column
    of ``sql``; tenant ids unredacted). Tenant columns hold pseudonyms when ``red`` is active.
    The query runs on its own cursor, so other queries can run while the chunks are written.
    ``every`` defaults to :data:`BATCH_LINES`.
    """
    # A cursor of its own; the lines need none of the case's macros.
    cur = con.cursor()
    try:
        tenants = [name for name, kind in columns if kind == "tenant"]
        redacting = red is not None and red.active and bool(tenants)
        if redacting:
            assert red is not None
            register_pseudonyms(cur, sql, tenants, red)
        yield ",".join(name for name, _ in columns) + "\n"
        cur.execute(lines_sql(columns, sql, order_by, pseudonyms=redacting))
        while batch := cur.fetchmany(every or BATCH_LINES):
            yield "".join(row[0] for row in batch)
    finally:
        cur.close()


def register_pseudonyms(
    cur: duckdb.DuckDBPyConnection, sql: str, tenants: list[str], red: Redactor
) -> None:
    """``__kv_pseudonyms`` on ``cur``: each distinct tenant id of those columns of ``sql`` and
    its pseudonym (a small table: one row per tenant, mapped in Python)."""
    import pyarrow as pa

    union = " UNION ".join(f"SELECT {_ident(name)} AS t FROM ({sql})" for name in tenants)
    # DISTINCT: one row per tenant, or the join repeats every line (UNION alone dedups only
    # when there are two columns or more).
    sql_ids = f"SELECT DISTINCT t FROM ({union}) WHERE t IS NOT NULL"
    ids = [r[0] for r in cur.execute(sql_ids).fetchall()]
    table = pa.table(
        {
            "tenant_id": pa.array(ids, pa.string()),
            "pseudonym": pa.array([red.tenant(t) for t in ids], pa.string()),
        }
    )
    cur.register("__kv_pseudonyms", table)
