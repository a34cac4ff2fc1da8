"""What the adapters share: a file's records as a table, node names, JSON assembly in SQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.adapters import compression
from forensics.readers import Source, open_lines, sql_str

if TYPE_CHECKING:
    import duckdb

    from forensics.readers import ByteProgress

# The per-file name of --log-requests-target files is ``{hostname}_{rank}.log``, rotated hourly
# with a ``.YYYY-mm-dd_HH`` suffix: the host is what comes before the rank.
_RANK = re.compile(r"_\d+$")
# How a JSON document spread over lines starts: a lone brace or bracket, or a first key or
# element; not a log line's "[2026-09-08 ...".
_DOCUMENT_START = r'^\s*(\{\s*("|$)|\[\s*(\{|\[|"|$))'


def open_records(
    con: duckdb.DuckDBPyConnection, path: Path, tag: str, progress: ByteProgress | None
) -> Source:
    """The file's records as ``(__kv_row, __kv_line)``: its non-blank lines, or, when the file
    is one JSON document spread over lines (pretty-printed), that document as row 1."""
    source = open_lines(con, path, compression(path), tag, progress)
    if source.empty:
        return source
    table = source.relation
    # Only a file whose first line starts like a JSON value but is no JSON value by itself is
    # tried as one document: log files and JSON Lines never pay for the whole-file join.
    [(starts, broken)] = con.execute(
        f"SELECT regexp_matches(arg_min(__kv_line, __kv_row), {sql_str(_DOCUMENT_START)}), "
        f"NOT json_valid(arg_min(__kv_line, __kv_row)) FROM {table}"
    ).fetchall()
    spread = False
    if starts and broken:
        [(spread,)] = con.execute(
            f"SELECT json_valid(string_agg(__kv_line, chr(10) ORDER BY __kv_row)) FROM {table}"
        ).fetchall()
    if spread:
        doc = f"{table}_doc"
        con.execute(
            f"CREATE TEMP TABLE {doc} AS SELECT min(__kv_row) AS __kv_row, "
            f"string_agg(__kv_line, chr(10) ORDER BY __kv_row) AS __kv_line FROM {table}"
        )
        source.cleanup.append(doc)
        source.relation = doc
    return source


def node_from_name(path: Path) -> str:
    """The engine node a log file's name gives: the name up to its first dot, without the
    ``_<rank>`` of a request-log file.

    >>> node_from_name(Path("logs/decode-1_0.log.2026-09-08_14.gz"))
    'decode-1'
    >>> node_from_name(Path("prefill-0.log"))
    'prefill-0'
    """
    return _RANK.sub("", path.name.split(".", 1)[0])


def json_object(pairs: dict[str, str], documents: tuple[str, ...] = ()) -> str:
    """SQL of a JSON object of ``name -> SQL value`` pairs, null members left out, NULL when
    every member is null. The values of the names in ``documents`` are JSON text already and
    go in as they are.

    The text is put together member by member: a null value makes its member null, which
    ``concat_ws`` skips. (A JSON function would parse and print the whole object again to drop
    the nulls, and ingest builds one such object per row.) Each value is evaluated once.
    """
    import json

    def member(name: str, value: str) -> str:
        text = f"CAST({value} AS VARCHAR)" if name in documents else f"to_json({value})"
        return f"{sql_str(json.dumps(name) + ':')} || {text}"

    members = ", ".join(member(k, v) for k, v in pairs.items())
    return f"nullif('{{' || concat_ws(',', {members}) || '}}', '{{}}')::JSON"


def without(document: str, paths: list[str]) -> str:
    """SQL of a JSON object with the members at ``paths`` (dotted) removed: what is left of a
    record once its mapped fields are taken out."""
    patch: dict = {}
    for dotted in paths:
        node = patch
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = None
    import json

    return f"json_merge_patch({document}, {sql_str(json.dumps(patch))})"


def adapted(
    base: Source,
    relation: str,
    columns: dict[str, str],
    *,
    pre_error: str = "NULL",
    extra: str | None = None,
    row_expr: str = "__kv_row",
    raw_expr: str = "__kv_line",
) -> Source:
    """A source of canonical columns (each an SQL text expression) over ``relation``, keeping
    what ``base`` knows about the file (temp tables, damage, rows cut by it)."""
    extra_sql: Callable[[set[str]], str | None] = lambda known: extra  # noqa: E731
    return Source(
        relation=relation,
        columns={name: (f"CAST({expr} AS VARCHAR)", "VARCHAR") for name, expr in columns.items()},
        row_expr=row_expr,
        raw_expr=raw_expr,
        pre_error=pre_error,
        extra_keys=extra_sql,
        early_rejects=base.early_rejects,
        empty=base.empty,
        problem=base.problem,
        rows_lost=base.rows_lost,
        damage=base.damage,
        cleanup=base.cleanup,
        temp_files=base.temp_files,
    )


def nothing(base: Source) -> Source:
    """The source of a file with no record at all (no line, no data row)."""
    return adapted(base, "(SELECT NULL::BIGINT AS __kv_row, NULL AS __kv_line WHERE false)", {})
