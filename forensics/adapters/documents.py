"""What the adapters of JSON exports share: a file's JSON values split into elements, and the
fields of each record read in one parse."""

from __future__ import annotations

from forensics.readers import sql_ident, sql_str


def elements(relation: str) -> str:
    """SQL of ``(line, item, doc, text, why)`` over a relation of ``(__kv_row, __kv_line)``.

    An array line gives one row per element (``item`` from 1), any other line itself (``item``
    0); ``doc`` is the row's JSON object, ``text`` its raw text (the line, or the element), and
    ``why`` says what a row that is no JSON object is (``doc`` is NULL then).
    """
    return f"""(
    WITH l AS MATERIALIZED (
      SELECT __kv_row, __kv_line, json_valid(__kv_line) AS ok,
        CASE WHEN json_valid(__kv_line) THEN json_type(__kv_line) END AS t
      FROM {relation}
    ),
    a AS (
      SELECT __kv_row AS line, generate_subscripts(from_json(__kv_line, '["JSON"]'), 1) AS item,
        unnest(from_json(__kv_line, '["JSON"]')) AS doc
      FROM l WHERE t = 'ARRAY'
    )
    SELECT line, item, CASE WHEN json_type(doc) = 'OBJECT' THEN doc END AS doc,
      doc::VARCHAR AS text, CASE WHEN json_type(doc) <> 'OBJECT' THEN 'not a JSON object' END AS why
    FROM a
    UNION ALL
    SELECT __kv_row, 0, CASE WHEN t = 'OBJECT' THEN __kv_line::JSON END, __kv_line,
      CASE WHEN NOT ok THEN 'not valid JSON' WHEN t <> 'OBJECT' THEN 'not a JSON object' END
    FROM l WHERE t IS DISTINCT FROM 'ARRAY'
    )"""


def fields(record: str, names: list[str]) -> tuple[str, str]:
    """SQL reading the top-level ``names`` of a JSON ``record`` at once, as ``__f``, and the
    select list naming them ``c_<name>`` (text, an empty string as NULL)."""
    paths = "[" + ", ".join(sql_str("$." + sql_ident(n)) for n in names) + "]"
    read = f"CASE WHEN {record} IS NOT NULL THEN json_extract_string({record}, {paths}) END AS __f"
    named = ", ".join(
        f"nullif(__f[{i + 1}], '') AS {sql_ident('c_' + n)}" for i, n in enumerate(names)
    )
    return read, named


def field(name: str) -> str:
    """The column :func:`fields` names a field."""
    return sql_ident("c_" + name)
