"""The casting query of canonical ingest, generated as DuckDB SQL.

Every canonical column is cast from what the reader gives (text, or a Parquet physical type) to
its canonical type, and each row's first problem becomes a reject reason. Nothing here samples
values to guess a type: the canonical schema decides, row by row, in one vectorised query.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from forensics import schema
from forensics.errors import EvidenceError
from forensics.readers import Source, sql_str

_SEP = "chr(31)"  # separates column name and reason inside one error string

_INT_RE = "'[+-]?[0-9]+'"
_NUM_RE = "'[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?'"
# An explicit offset or Z after a time of day (a date alone ends in "-08", which is no offset).
_OFFSET_RE = "'[Tt ][0-9]{2}:[0-9]{2}.*([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$'"
_MIN_US, _MAX_US = -62135596800000000, 253402300799999999  # years 0001..9999


def _is_text(dtype: str) -> bool:
    return dtype == "VARCHAR"


def _family(dtype: str) -> str:
    d = dtype.upper()
    if d == "VARCHAR":
        return "text"
    if d in (
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "HUGEINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
        "UHUGEINT",
    ):
        return "int"
    if d in ("FLOAT", "DOUBLE", "REAL") or d.startswith("DECIMAL"):
        return "float"
    if d in ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"):
        return "timestamptz"
    if d.startswith("TIMESTAMP") or d == "DATE":
        return "timestamp"
    return "other"


def _epoch_from_us(us: str) -> str:
    return (
        f"CASE WHEN ({us}) BETWEEN {_MIN_US} AND {_MAX_US} "
        f"THEN timezone('UTC', make_timestamp(({us})::BIGINT)) END"
    )


def _epoch_int(n: str) -> str:
    """Epoch seconds, ms, us or ns (told apart by magnitude) as TIMESTAMPTZ, in integers."""
    us = (
        f"CASE WHEN {n} BETWEEN -99999999999 AND 99999999999 THEN {n} * 1000000 "
        f"WHEN {n} BETWEEN -99999999999999 AND 99999999999999 THEN {n} * 1000 "
        f"WHEN {n} BETWEEN -99999999999999999 AND 99999999999999999 THEN {n} "
        f"ELSE {n} // 1000 END"
    )
    return _epoch_from_us(us)


def _epoch_double(d: str) -> str:
    us = (
        f"TRY_CAST(round(CASE WHEN abs({d}) < 1e11 THEN {d} * 1e6 "
        f"WHEN abs({d}) < 1e14 THEN {d} * 1e3 WHEN abs({d}) < 1e17 THEN {d} "
        f"ELSE {d} / 1e3 END) AS BIGINT)"
    )
    return _epoch_from_us(us)


def _text_cast(ctype: str, s: str, tz: str) -> str:
    """SQL casting text expression ``s`` to canonical type ``ctype``; NULL when it does not."""
    t = f"trim({s})"
    if ctype == "string":
        return f"CASE WHEN trim({s}) = '' THEN NULL ELSE {s} END"
    if ctype == "float":
        return f"TRY_CAST({t} AS DOUBLE)"
    if ctype == "int":
        d = f"TRY_CAST({t} AS DOUBLE)"
        # Integral decimals ("12.0", "1e3") are accepted, exactly, only below 2**53.
        return (
            f"CASE WHEN regexp_full_match({t}, {_INT_RE}) THEN TRY_CAST({t} AS BIGINT) "
            f"WHEN isfinite({d}) AND {d} = floor({d}) AND abs({d}) < 9007199254740992 "
            f"THEN CAST({d} AS BIGINT) END"
        )
    # timestamp
    return (
        f"CASE WHEN regexp_full_match({t}, {_INT_RE}) "
        f"THEN {_epoch_int(f'TRY_CAST({t} AS BIGINT)')} "
        f"WHEN regexp_full_match({t}, {_NUM_RE}) THEN {_epoch_double(f'TRY_CAST({t} AS DOUBLE)')} "
        f"WHEN regexp_matches({t}, {_OFFSET_RE}) "
        f"THEN TRY_CAST(regexp_replace({t}, '[Zz]$', '+00:00') AS TIMESTAMPTZ) "
        # Naive means the manifest's zone; a trailing zone name ("... Europe/Rome") also works.
        f"ELSE coalesce(timezone({sql_str(tz)}, TRY_CAST({t} AS TIMESTAMP)), "
        f"TRY_CAST({t} AS TIMESTAMPTZ)) END"
    )


def _as_text(v: str, dtype: str) -> str:
    fam = _family(dtype)
    if fam == "text":
        return v
    if fam == "other" and (
        dtype.startswith("STRUCT") or dtype.endswith("]") or dtype.startswith("MAP")
    ):
        return f"CAST(to_json({v}) AS VARCHAR)"
    return f"CAST({v} AS VARCHAR)"


def _typed_cast(ctype: str, v: str, dtype: str, tz: str) -> str:
    """SQL casting a typed (Parquet) expression ``v`` of DuckDB type ``dtype`` to ``ctype``."""
    fam = _family(dtype)
    if fam == "text" or fam == "other":
        return _text_cast(ctype, _as_text(v, dtype), tz)
    if ctype == "string":
        return f"CAST({v} AS VARCHAR)"
    if ctype == "int":
        if fam == "int":
            return f"TRY_CAST({v} AS BIGINT)"
        if fam == "float":
            d = f"CAST({v} AS DOUBLE)"
            return (
                f"CASE WHEN isfinite({d}) AND {d} = floor({d}) AND abs({d}) < 9007199254740992 "
                f"THEN CAST({d} AS BIGINT) END"
            )
        return "NULL::BIGINT"  # a timestamp is no token count: the row is rejected
    if ctype == "float":
        return f"TRY_CAST({v} AS DOUBLE)" if fam in ("int", "float") else "NULL::DOUBLE"
    # timestamp
    if fam == "timestamptz":
        return f"CAST({v} AS TIMESTAMPTZ)"
    if fam == "timestamp":
        return f"timezone({sql_str(tz)}, CAST({v} AS TIMESTAMP))"
    if fam == "int":
        return _epoch_int(f"TRY_CAST({v} AS BIGINT)")
    return _epoch_double(f"CAST({v} AS DOUBLE)")


_WHAT = {"int": "an integer", "float": "a number", "timestamp": "a timestamp"}


def _quoted(text_sql: str) -> str:
    return (
        f"'''' || left({text_sql}, 80) || "
        f"CASE WHEN length({text_sql}) > 80 THEN '...' ELSE '' END || ''''"
    )


def stage_sql(
    kind: str, source: Source, tz: str, defaults: dict[str, Any]
) -> tuple[str, list[str]]:
    """The query that casts every canonical column and finds each row's first problem.

    Returns:
        The SELECT, and the canonical column names in the order of its ``__kv_t{i}`` outputs.

    Raises:
        EvidenceError: a required column is missing from the file and has no default.
    """
    cols = schema.columns(kind)
    missing = [
        c.name
        for c in cols
        if c.required and c.name not in source.columns and defaults.get(c.name) is None
    ]
    if missing and not source.empty:
        found = ", ".join(sorted(source.columns)) or "none"
        names = ", ".join(repr(m) for m in missing)
        plural = "s" if len(missing) > 1 else ""
        raise EvidenceError(
            f"missing required column{plural} {names} for kind {kind} (columns found: {found})"
        )
    guard = source.pre_error != "NULL"
    values, typed, errors = [], [], []
    for i, col in enumerate(cols):
        if col.name in source.columns:
            expr, dtype = source.columns[col.name]
            if guard:
                expr = f"CASE WHEN __kv_pre IS NULL THEN {expr} END"
        elif defaults.get(col.name) is not None:
            value = defaults[col.name]
            expr = sql_str(value.isoformat() if isinstance(value, datetime) else value)
            dtype = "VARCHAR"
        else:
            expr, dtype = f"NULL::{schema.SQL_TYPE[col.type]}", "NULL"
        v = f"__kv_v{i}"
        values.append(f"{expr} AS {v}")
        if dtype == "NULL":
            typed.append(f"{v} AS __kv_t{i}")
            continue
        cast = (
            _text_cast(col.type, v, tz) if _is_text(dtype) else _typed_cast(col.type, v, dtype, tz)
        )
        typed.append(f"{cast} AS __kv_t{i}")
        blank = f"({v} IS NULL OR trim({v}) = '')" if _is_text(dtype) else f"{v} IS NULL"
        name = sql_str(col.name)
        if col.required:
            errors.append(f"WHEN {blank} THEN {name} || {_SEP} || 'required value missing'")
        if col.type != "string":
            errors.append(
                f"WHEN __kv_t{i} IS NULL AND NOT {blank} THEN {name} || {_SEP} || "
                f"'not {_WHAT[col.type]}: ' || {_quoted(_as_text(v, dtype))}"
            )
    extra = source.extra_keys({c.name for c in cols}) or "NULL"
    if guard and extra != "NULL":
        extra = f"CASE WHEN __kv_pre IS NULL THEN {extra} END"
    err = (
        "CASE WHEN __kv_pre IS NOT NULL THEN " + _SEP + " || __kv_pre " + " ".join(errors) + " END"
    )
    sql = (
        "SELECT __kv_r, "
        + ", ".join(f"__kv_t{i}" for i in range(len(cols)))
        + ", __kv_extra, __kv_err, "
        + f"CASE WHEN __kv_err IS NOT NULL THEN {source.raw_expr} END AS __kv_raw FROM ("
        + f"SELECT *, {err} AS __kv_err FROM ("
        + "SELECT *, "
        + ", ".join(typed)
        + f", CAST({extra} AS JSON) AS __kv_extra FROM ("
        + f"SELECT *, {source.row_expr} AS __kv_r, {source.pre_error} AS __kv_pre, "
        + ", ".join(values)
        + f" FROM {source.relation})))"
    )
    return sql, [c.name for c in cols]
