"""The casting query of canonical ingest, generated as DuckDB SQL.

Every canonical column is cast from what the reader gives (text, or a Parquet physical type) to
its canonical type, and each row's first problem becomes a reject reason. Nothing here samples
values to guess a type: the canonical schema decides, row by row, in one vectorised query.

A value that casts is still checked against what a real log can hold (``schema.VALUE_BOUNDS``,
the timestamp range, the order of one record's events in ``schema.NOT_BEFORE``); a naive
timestamp must name one instant in the manifest's zone (not a time the clocks skipped or
repeated). Sub-microsecond digits are dropped, whatever the form.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

from forensics import schema
from forensics.errors import EvidenceError
from forensics.readers import Source, sql_str

_SEP = "chr(31)"  # separates column name and reason inside one error string

_INT_RE = "'[+-]?[0-9]+'"
_NUM_RE = "'[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?'"
# Epoch seconds with up to six decimals, as engines log them ("1787788936.233002"): exact in
# DECIMAL(18, 6), whose arithmetic is several times cheaper than the general form's.
_SECONDS_RE = "'[+-]?[0-9]{1,11}[.][0-9]{0,6}'"
# An explicit offset or Z after a time of day (a date alone ends in "-08", which is no offset).
_OFFSET_RE = "'[Tt ][0-9]{2}:[0-9]{2}.*([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$'"
# RFC 3339 as most logs write it: read by DuckDB's own cast, which the general path below
# reaches too for this form (after four other tests), so the fast path changes no value.
_RFC3339_RE = (
    "'[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,6})?"
    "(Z|[+-][0-9]{2}:[0-9]{2})'"
)
_MIN_US, _MAX_US = -62135596800000000, 253402300799999999  # years 0001..9999
# A number too large to be any instant: kept as an infinite instant so that the reject says
# "out of range" rather than "not a timestamp".
_PAST, _FUTURE = "'-infinity'::TIMESTAMPTZ", "'infinity'::TIMESTAMPTZ"


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


def _epoch_from_us(us: str, sign: str) -> str:
    """Microseconds since the epoch as TIMESTAMPTZ; beyond years 1..9999 an infinite instant
    (NULL microseconds, a number too large to convert, take the side of ``sign``)."""
    return (
        f"CASE WHEN ({sign}) IS NULL THEN NULL "
        f"WHEN ({us}) BETWEEN {_MIN_US} AND {_MAX_US} "
        f"THEN timezone('UTC', make_timestamp(({us})::BIGINT)) "
        f"WHEN ({us}) < {_MIN_US} OR ({sign}) < 0 THEN {_PAST} ELSE {_FUTURE} END"
    )


def _epoch_int(n: str) -> str:
    """Epoch seconds, ms, us or ns (told apart by magnitude) as TIMESTAMPTZ, in integers."""
    us = (
        f"CASE WHEN {n} BETWEEN -99999999999 AND 99999999999 THEN {n} * 1000000 "
        f"WHEN {n} BETWEEN -99999999999999 AND 99999999999999 THEN {n} * 1000 "
        f"WHEN {n} BETWEEN -99999999999999999 AND 99999999999999999 THEN {n} "
        f"ELSE {n} // 1000 END"
    )
    return _epoch_from_us(us, n)


def _epoch_text(t: str) -> str:
    """Epoch text with digits the integer form cannot hold (a fraction, an exponent, more than
    19 digits): exact decimal arithmetic, so "1788876123.1" is .100000 s, not .099999."""
    d = f"TRY_CAST({t} AS DECIMAL(38, 10))"
    us = (
        f"TRY_CAST(CASE WHEN abs({d}) < 1e11 THEN floor({d} * 1000000) "
        f"WHEN abs({d}) < 1e14 THEN floor({d} * 1000) WHEN abs({d}) < 1e17 THEN floor({d}) "
        f"ELSE TRY_CAST(floor({d}) AS HUGEINT) // 1000 END AS BIGINT)"
    )
    # A number beyond DECIMAL(38, 10) still has a sign: the double reading gives it.
    return _epoch_from_us(us, f"coalesce({d}, TRY_CAST({t} AS DOUBLE))")


def _epoch_seconds(t: str) -> str:
    """Epoch text matching ``_SECONDS_RE``: seconds with at most six decimals, so its
    microseconds are exact in DECIMAL(18, 6) (the same instant :func:`_epoch_text` gives)."""
    d = f"TRY_CAST({t} AS DECIMAL(18, 6))"
    return _epoch_from_us(f"CAST({d} AS DECIMAL(38, 6)) * 1000000", d)


def _epoch_double(d: str) -> str:
    us = (
        f"TRY_CAST(round(CASE WHEN abs({d}) < 1e11 THEN {d} * 1e6 "
        f"WHEN abs({d}) < 1e14 THEN {d} * 1e3 WHEN abs({d}) < 1e17 THEN {d} "
        f"ELSE {d} / 1e3 END) AS BIGINT)"
    )
    return _epoch_from_us(us, d)


def _naive_text(t: str) -> str:
    """The wall-clock time of a timestamp without offset (NULL for the other forms)."""
    return (
        f"CASE WHEN NOT regexp_full_match({t}, {_NUM_RE}) "
        f"AND NOT regexp_matches({t}, {_OFFSET_RE}) THEN TRY_CAST({t} AS TIMESTAMP) END"
    )


def _text_cast(ctype: str, s: str, tz: str) -> str:
    """SQL casting text expression ``s`` to canonical type ``ctype``; NULL when it does not."""
    t = f"trim({s})"
    if ctype == "string":
        # trim() copies the text: only a value whose first character is not a printable ASCII
        # letter, digit or sign between them can be blank, so only those pay for it.
        return (
            f"CASE WHEN {s} = '' OR (NOT ({s}[1] BETWEEN '0' AND 'z') AND trim({s}) = '') "
            f"THEN NULL ELSE {s} END"
        )
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
        f"CASE WHEN regexp_full_match({s}, {_RFC3339_RE}) THEN TRY_CAST({s} AS TIMESTAMPTZ) "
        f"WHEN regexp_full_match({t}, {_INT_RE}) AND TRY_CAST({t} AS BIGINT) IS NOT NULL "
        f"THEN {_epoch_int(f'TRY_CAST({t} AS BIGINT)')} "
        f"WHEN regexp_full_match({t}, {_SECONDS_RE}) THEN {_epoch_seconds(t)} "
        f"WHEN regexp_full_match({t}, {_NUM_RE}) THEN {_epoch_text(t)} "
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


def _naive(v: str, dtype: str) -> str | None:
    """SQL of the wall-clock reading of a timestamp column in the manifest's zone, or None
    when no value of this type is read that way."""
    fam = _family(dtype)
    if fam == "timestamp":
        return f"CAST({v} AS TIMESTAMP)"
    if fam in ("text", "other"):
        return _naive_text(f"trim({_as_text(v, dtype)})")
    return None


@cache
def has_transitions(tz: str) -> bool:
    """Whether the zone's offset from UTC changes within the timestamp bounds (daylight saving
    or a change of standard time), so that some wall-clock times are skipped or repeated.

    >>> has_transitions("UTC"), has_transitions("Europe/Rome"), has_transitions("Asia/Tokyo")
    (False, True, False)
    """
    zone = ZoneInfo(tz)
    offsets = {
        datetime(year, month, 1, tzinfo=UTC).astimezone(zone).utcoffset()
        for year in range(2000, 2100)
        for month in (1, 4, 7, 10)
    }
    return len(offsets) > 1


def _wall_clock_problem(u: str, n: str, tz: str) -> str:
    """SQL naming what is wrong with wall-clock time ``n`` read as instant ``u`` in ``tz``:
    'skipped' (the clocks jumped over it), 'repeated' (it happened twice), else NULL.

    Only values within a day of an offset change take the exact test; for the rest two
    conversions show that the offset is the same a day before and a day after.
    """
    z = sql_str(tz)

    def offset(x: str) -> str:
        # The session runs in UTC, so a TIMESTAMPTZ cast to TIMESTAMP is its UTC wall clock.
        return f"(timezone({z}, {x}) - CAST({x} AS TIMESTAMP))"

    before, after = offset(f"({u} - INTERVAL 1 DAY)"), offset(f"({u} + INTERVAL 1 DAY)")
    early, late = f"CAST({n} - {before} AS TIMESTAMPTZ)", f"CAST({n} - {after} AS TIMESTAMPTZ)"
    return (
        f"CASE WHEN {n} IS NULL OR {u} IS NULL "
        f"OR NOT ({u} BETWEEN TIMESTAMPTZ '{schema.TIME_LOW}' AND TIMESTAMPTZ '{schema.TIME_HIGH}')"
        f" THEN NULL WHEN {before} = {after} THEN NULL "
        f"WHEN timezone({z}, {u}) <> {n} THEN 'skipped' "
        f"WHEN {early} <> {late} AND timezone({z}, {early}) = {n} "
        f"AND timezone({z}, {late}) = {n} THEN 'repeated' END"
    )


_WHAT = {"int": "an integer", "float": "a number", "timestamp": "a timestamp"}


def _quoted(text_sql: str) -> str:
    return (
        f"'''' || left({text_sql}, 80) || "
        f"CASE WHEN length({text_sql}) > 80 THEN '...' ELSE '' END || ''''"
    )


def stage_sql(
    kind: str,
    source: Source,
    tz: str,
    defaults: dict[str, Any],
    flagged: str | None = None,
    keep: tuple[str, ...] = (),
) -> tuple[str, list[str]]:
    """The query that casts every canonical column and finds each row's first problem.

    Args:
        kind: the canonical table.
        source: the file as a relation (see :mod:`forensics.readers`).
        tz: the zone of timestamps without an offset.
        defaults: column -> value for columns the file lacks.
        flagged: a table of ``(source_row, column_name, reason)`` for rows that cast but are
            rejected all the same (duplicates found after loading); their reason becomes the
            row's problem.
        keep: columns of ``source.relation`` passed through to the output as they are.

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
    dst = has_transitions(tz)
    index = {c.name: i for i, c in enumerate(cols)}
    present: set[int] = set()  # columns the file (or a default) gives
    values, typed, checks, errors = [], [], [], []
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
        shown = _quoted(_as_text(v, dtype))
        present.add(i)
        if col.required:
            errors.append(f"WHEN {blank} THEN {name} || {_SEP} || 'required value missing'")
        if col.type == "string":
            continue
        t = f"__kv_t{i}"
        errors.append(
            f"WHEN {t} IS NULL AND NOT {blank} THEN {name} || {_SEP} || "
            f"'not {_WHAT[col.type]}: ' || {shown}"
        )
        if col.type == "timestamp":
            naive = _naive(v, dtype) if dst else None
            if naive is not None:
                typed.append(f"{naive} AS __kv_n{i}")
                checks.append(f"{_wall_clock_problem(t, f'__kv_n{i}', tz)} AS __kv_z{i}")
                zone = tz.replace("'", "''")
                errors.append(
                    f"WHEN __kv_z{i} = 'skipped' THEN {name} || {_SEP} || "
                    f"'nonexistent local time: ' || {shown} || "
                    f"' falls where the clocks of {zone} went forward'"
                )
                errors.append(
                    f"WHEN __kv_z{i} = 'repeated' THEN {name} || {_SEP} || "
                    f"'ambiguous local time: ' || {shown} || ' happened twice in {zone} "
                    "(the clocks went back); log it with an offset'"
                )
            errors.append(
                f"WHEN NOT ({t} >= TIMESTAMPTZ '{schema.TIME_LOW}' "
                f"AND {t} < TIMESTAMPTZ '{schema.TIME_HIGH}') THEN {name} || {_SEP} || "
                f"'out of range: ' || {shown} || ' ({schema.TIME_BOUNDS_TEXT})'"
            )
        else:
            bounds = schema.VALUE_BOUNDS[col.name]
            outside = f"NOT ({t} BETWEEN {bounds.low} AND {bounds.high})"
            if col.type == "float":
                # NaN and infinities first: DuckDB's comparisons with NaN differ between
                # constants and columns.
                outside = f"NOT isfinite({t}) OR {outside}"
            errors.append(
                f"WHEN {outside} THEN {name} || {_SEP} || "
                f"'out of range: ' || {shown} || ' ({bounds.describe()})'"
            )
        for later, earlier in schema.NOT_BEFORE.get(kind, ()):
            j = index[earlier]
            if later != col.name or j not in present:
                continue
            errors.append(
                f"WHEN {t} < __kv_t{j} THEN {name} || {_SEP} || 'before {earlier}: ' || {shown}"
                f" || ' is earlier than {earlier} (' || CAST(__kv_t{j} AS VARCHAR) || ')'"
            )
    if flagged is not None:
        errors.append("WHEN __kv_flag_reason IS NOT NULL THEN __kv_flag")
    extra = source.extra_keys({c.name for c in cols}) or "NULL"
    if guard and extra != "NULL":
        extra = f"CASE WHEN __kv_pre IS NULL THEN {extra} END"
    err = (
        "CASE WHEN __kv_pre IS NOT NULL THEN " + _SEP + " || __kv_pre " + " ".join(errors) + " END"
    )
    relation = source.relation
    if flagged is not None:
        relation = (
            f"(SELECT __kv_s.*, __kv_f.reason AS __kv_flag_reason, "
            f"coalesce(__kv_f.column_name, '') || {_SEP} || __kv_f.reason AS __kv_flag "
            f"FROM {source.relation} __kv_s LEFT JOIN {flagged} __kv_f "
            f"ON __kv_f.source_row = ({source.row_expr}))"
        )
    inner = (
        "SELECT *, "
        + ", ".join(typed)
        + f", CAST({extra} AS JSON) AS __kv_extra FROM ("
        + f"SELECT *, {source.row_expr} AS __kv_r, {source.pre_error} AS __kv_pre, "
        + ", ".join(values)
        + f" FROM {relation})"
    )
    if checks:
        # The wall-clock checks read the cast values, so they sit one level above the casts.
        inner = f"SELECT *, {', '.join(checks)} FROM ({inner})"
    sql = (
        "SELECT __kv_r, "
        + ", ".join(f"__kv_t{i}" for i in range(len(cols)))
        + ", __kv_extra, __kv_err, "
        + "".join(f"{k}, " for k in keep)
        + f"CASE WHEN __kv_err IS NOT NULL THEN {source.raw_expr} END AS __kv_raw FROM ("
        + f"SELECT *, {err} AS __kv_err FROM ("
        + inner
        + "))"
    )
    return sql, [c.name for c in cols]
