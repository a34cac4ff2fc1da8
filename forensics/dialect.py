"""DuckDB SQL as Spark SQL: the detection SQL is written once, for DuckDB, and translated here.

sqlglot reads DuckDB and writes Spark; what it passes through untranslated or translates with
another meaning is fixed on the syntax tree before Spark sees it:

- named parameters (``$name``) become literals, so a statement is one self-contained string;
- the shared rules (``CREATE MACRO``, scalar and table macros) are expanded in place;
- an as-of join becomes Spark's ``ASOF JOIN ... MATCH_CONDITION``;
- what DuckDB and Spark both accept but evaluate differently gets Spark's equivalent of
  DuckDB's meaning (``list(x ORDER BY y)``, ``epoch_ms`` rounding, ``date_diff`` boundaries,
  ``format`` with a NULL, ``/`` of decimals or by zero, 1-based subscripts...: one rule each,
  listed in ``_rules()``);
- DuckDB's ``rowid`` pseudo-column becomes the ``__rowid`` column the Spark tables carry.

A statement using something this module does not know raises ``UntranslatableSQL`` naming the
construct, rather than running with another meaning.

>>> to_spark("SELECT epoch_us(at) AS us FROM t WHERE n = $n", {"n": 3})
'SELECT UNIX_MICROS(at) AS us FROM t WHERE n = 3'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    from sqlglot import exp

ROWID = "__rowid"


class UntranslatableSQL(ForensicsError):
    """A statement uses a DuckDB construct with no Spark translation here."""


@dataclass(frozen=True)
class Macro:
    """A DuckDB macro: its parameter names and body (an expression, or a query for a table
    macro)."""

    name: str
    params: tuple[str, ...]
    body: exp.Expr
    table: bool


def parse_macros(text: str) -> dict[str, Macro]:
    """The ``CREATE MACRO`` statements of a SQL text, by lower-case name (others are skipped).

    >>> m = parse_macros("CREATE MACRO add1(x) AS x + 1; SELECT 1")
    >>> m["add1"].params, m["add1"].body.sql()
    (('x',), 'x + 1')
    """
    import sqlglot
    from sqlglot import exp

    out = {}
    for statement in sqlglot.parse(text, read="duckdb"):
        if isinstance(statement, exp.Create) and statement.kind == "MACRO":
            udf = statement.this
            name = udf.this.name.lower()
            params = tuple(p.name for p in udf.expressions)
            table = isinstance(statement.expression, exp.Query)
            out[name] = Macro(name, params, statement.expression, table)
    return out


def literal(value: Any) -> exp.Expr:
    """A Python value as a SQL literal (the parameter binding of a translated statement).

    >>> [literal(v).sql("spark") for v in (None, True, 3, 0.5, "it's", [1, 2])]
    ['NULL', 'TRUE', '3', '0.5', "'it\\\\'s'", 'ARRAY(1, 2)']
    """
    from sqlglot import exp

    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(repr(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise UntranslatableSQL(f"naive datetime parameter {value!r}: give it a time zone")
        text = value.isoformat(sep=" ").replace("+00:00", "Z")
        return exp.cast(exp.Literal.string(text), exp.DataType.build("TIMESTAMP"))
    if isinstance(value, list | tuple):
        return exp.Array(expressions=[literal(v) for v in value])
    if isinstance(value, dict):
        return exp.Struct(
            expressions=[
                exp.PropertyEQ(this=exp.to_identifier(k), expression=literal(v))
                for k, v in value.items()
            ]
        )
    raise UntranslatableSQL(f"parameter of type {type(value).__name__}: {value!r}")


def bind(tree: exp.Expr, values: dict[str, Any] | list | None) -> exp.Expr:
    """Replace the statement's parameters (``$name``, or ``?`` in order) with literals."""
    from sqlglot import exp

    positional = iter(values) if isinstance(values, list | tuple) else None
    named: dict[str, Any] = values if isinstance(values, dict) else {}

    def swap(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Placeholder):
            return node
        if positional is not None:
            return literal(next(positional))
        if node.name not in named:
            raise UntranslatableSQL(f"no value for parameter ${node.name}")
        return literal(named[node.name])

    return tree.transform(swap)


def expand_macros(tree: exp.Expr, macros: dict[str, Macro]) -> exp.Expr:
    """Expand every macro call in place, macros called by macros included."""
    from sqlglot import exp

    for _ in range(20):
        changed = False

        def swap(node: exp.Expr) -> exp.Expr:
            nonlocal changed
            call = _macro_call(node, macros)
            if call is None:
                return node
            macro, args = call
            if len(args) != len(macro.params):
                raise UntranslatableSQL(
                    f"macro {macro.name} takes {len(macro.params)} arguments, got {len(args)}"
                )
            changed = True
            body = _substitute(macro, dict(zip(macro.params, args, strict=True)))
            if macro.table:
                alias = node.args.get("alias") if isinstance(node, exp.Table) else None
                return exp.Subquery(
                    this=body, alias=alias or exp.TableAlias(this=exp.to_identifier(macro.name))
                )
            return exp.Paren(this=body)

        tree = tree.transform(swap)
        if not changed:
            return tree
    raise UntranslatableSQL("macros nested more than 20 deep")


def _macro_call(node: exp.Expr, macros: dict[str, Macro]):
    from sqlglot import exp

    if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
        func = node.this
    elif isinstance(node, exp.Anonymous) and not isinstance(node.parent, exp.Table):
        func = node
    else:
        return None
    macro = macros.get(func.name.lower())
    if macro is None:
        return None
    return macro, list(func.expressions)


def _substitute(macro: Macro, args: dict[str, exp.Expr]) -> exp.Expr:
    """The macro's body with its parameters replaced by the call's arguments. A table macro's
    ``query_table(p)`` names the table whose name the argument gives."""
    from sqlglot import exp

    def swap(node: exp.Expr) -> exp.Expr:
        if (
            isinstance(node, exp.Table)
            and isinstance(node.this, exp.Anonymous)
            and node.this.name.lower() == "query_table"
        ):
            arg = args.get(node.this.expressions[0].name)
            if not isinstance(arg, exp.Literal) or not arg.is_string:
                raise UntranslatableSQL(f"{macro.name}: query_table needs a table name")
            return exp.Table(this=exp.to_identifier(arg.this), alias=node.args.get("alias"))
        if isinstance(node, exp.Column) and not node.table and node.name in args:
            return exp.Paren(this=args[node.name].copy())
        return node

    return macro.body.copy().transform(swap)


def to_spark(
    sql: str | exp.Expr,
    values: dict[str, Any] | list | None = None,
    macros: dict[str, Macro] | None = None,
) -> str:
    """One DuckDB statement as Spark SQL, parameters bound and macros expanded.

    >>> to_spark("SELECT * FROM a ASOF LEFT JOIN b ON a.n = b.n AND a.t >= b.t")
    'SELECT * FROM a LEFT ASOF JOIN b MATCH_CONDITION (a.t >= b.t) ON a.n = b.n'
    """
    return spark_tree(sql, values, macros).sql(dialect=spark_dialect())


def spark_tree(
    sql: str | exp.Expr,
    values: dict[str, Any] | list | None = None,
    macros: dict[str, Macro] | None = None,
    schema: dict[str, dict[str, str]] | None = None,
) -> exp.Expr:
    """The syntax tree of ``to_spark``. ``schema`` (table -> column -> type) lets a
    ``* REPLACE (...)``, which Spark lacks, be written out column by column.

    >>> spark_tree("SELECT * REPLACE (a + 1 AS a) FROM t", schema={"t": {"a": "INT", "b": "INT"}}
    ...            ).sql("spark")
    'SELECT t.a + 1 AS a, t.b AS b FROM t AS t'
    """
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="duckdb") if isinstance(sql, str) else sql.copy()
    tree = bind(tree, values)
    tree = expand_macros(tree, macros or {})
    if any(star.args.get("replace") for star in tree.find_all(exp.Star)):
        if schema is None:
            raise UntranslatableSQL("* REPLACE (...) needs the tables' columns")
        tree = _expand_stars(tree, schema)
    return rewrite(tree)


def _expand_stars(tree: exp.Expr, schema: dict[str, dict[str, str]]) -> exp.Expr:
    from sqlglot.optimizer.qualify import qualify

    tables: dict[str, object] = dict(schema)
    return qualify(
        tree,
        schema=tables,
        dialect="duckdb",
        expand_stars=True,
        validate_qualify_columns=False,
        quote_identifiers=False,
        identify=False,
    )


@functools.cache
def spark_dialect():
    """sqlglot's Spark dialect, writing an as-of join the way Spark parses it (the side before
    ``ASOF``: ``LEFT ASOF JOIN``)."""
    from sqlglot.dialects.spark import Spark

    base = Spark.Generator

    def join_sql(self, expression, join_op=None):
        if (expression.args.get("method") or "").upper() != "ASOF":
            return base.join_sql(self, expression, join_op)
        side = expression.side
        plain = expression.copy()
        plain.set("method", None)
        plain.set("side", None)
        return base.join_sql(self, plain, join_op=f"{side} ASOF JOIN" if side else "ASOF JOIN")

    class SparkSQL(Spark):
        pass

    SparkSQL.generator_class = type("Generator", (base,), {"join_sql": join_sql})  # type: ignore[assignment]
    return SparkSQL()


# --- DuckDB constructs with another meaning (or none) in Spark ------------------------------


def rewrite(tree: exp.Expr) -> exp.Expr:
    """Rewrite, in a parsed DuckDB statement, what Spark reads differently (module docstring)."""
    from sqlglot import exp

    aliases = {t.alias_or_name.lower() for t in tree.find_all(exp.Table)}

    rules = _rules()

    def swap(node: exp.Expr) -> exp.Expr:
        for kind, rule in rules:
            if isinstance(node, kind):
                return rule(node, aliases)
        if isinstance(node, exp.Anonymous):
            function = _FUNCTIONS.get(node.name.lower())
            if function is not None:
                return function(node)
        return node

    # Innermost first (a node after everything under it), so a rule that copies its
    # arguments copies them already rewritten.
    for node in reversed(list(tree.walk(bfs=False))):
        new = swap(node)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    return tree


def _asof(join: exp.Join, _aliases) -> exp.Expr:
    """``ASOF [LEFT] JOIN t ON eq AND ineq`` -> Spark's ``MATCH_CONDITION (ineq) ON eq``."""
    from sqlglot import exp

    if join.args.get("method", "").upper() != "ASOF":
        return join
    conditions = (
        list(join.args["on"].flatten())
        if isinstance(join.args.get("on"), exp.And)
        else [join.args["on"]]
        if join.args.get("on") is not None
        else []
    )
    inequalities = [c for c in conditions if isinstance(c, exp.GT | exp.GTE | exp.LT | exp.LTE)]
    if len(inequalities) != 1:
        raise UntranslatableSQL("an as-of join needs exactly one inequality in its ON clause")
    rest = [c for c in conditions if c is not inequalities[0]]
    join = join.copy()
    join.set("match_condition", inequalities[0].copy())
    join.set("on", exp.and_(*[c.copy() for c in rest]) if rest else exp.true())
    return join


def _ordered_list(agg: exp.ArrayAgg, _aliases) -> exp.Expr:
    """DuckDB's ``list(x [ORDER BY k...])`` keeps NULLs and its order; Spark's collect_list
    drops both. Collect structs (never NULL), sort them by the keys, keep the values."""
    from sqlglot import exp

    inner = agg.this
    keys: list[exp.Expr] = []
    if isinstance(inner, exp.Order):
        for ordered in inner.expressions:
            if ordered.args.get("desc") or ordered.args.get("nulls_first"):
                raise UntranslatableSQL("list(... ORDER BY ... DESC or NULLS FIRST)")
            keys.append(ordered.this)
        inner = inner.this
    fields = [exp.alias_(k.copy(), f"__k{i}") for i, k in enumerate(keys)]
    fields.append(exp.alias_(inner.copy(), "__v"))
    collected = exp.Anonymous(
        this="COLLECT_LIST", expressions=[exp.Anonymous(this="STRUCT", expressions=fields)]
    )
    if keys:
        collected = exp.Anonymous(this="ARRAY_SORT", expressions=[collected])
    lam = exp.Lambda(
        this=exp.Dot(this=exp.column("__e"), expression=exp.to_identifier("__v")),
        expressions=[exp.to_identifier("__e")],
    )
    return exp.Anonymous(this="TRANSFORM", expressions=[collected, lam])


def _whole_row_arg(node: exp.ArgMax | exp.ArgMin, aliases) -> exp.Expr:
    """``arg_min(l, (a, b))`` with ``l`` a table alias: the whole row, by a tuple of keys."""
    from sqlglot import exp

    node = node.copy()
    value = node.this
    if isinstance(value, exp.Column) and not value.table and value.name.lower() in aliases:
        row = exp.Column(this=exp.Star(), table=value.this)
        node.set("this", exp.Anonymous(this="STRUCT", expressions=[row]))
    key = node.expression
    if isinstance(key, exp.Tuple):
        node.set(
            "expression",
            exp.Anonymous(
                this="STRUCT",
                expressions=[exp.alias_(k, f"__k{i}") for i, k in enumerate(key.expressions)],
            ),
        )
    return node


def _log(node: exp.Log, _aliases) -> exp.Expr:
    """DuckDB's one-argument log is base 10; Spark's is natural."""
    from sqlglot import exp

    if node.expression is None:
        return exp.Anonymous(this="LOG10", expressions=[node.this])
    return node


def _strftime(node: exp.TimeToStr, _aliases) -> exp.Expr:
    """strftime's %-codes as a Java pattern, literal text quoted."""
    from sqlglot import exp

    fmt = node.args["format"]
    if not isinstance(fmt, exp.Literal):
        raise UntranslatableSQL("strftime with a format that is not a literal")
    return exp.Anonymous(
        this="DATE_FORMAT", expressions=[node.this, exp.Literal.string(java_pattern(fmt.this))]
    )


_STRFTIME = {"Y": "yyyy", "m": "MM", "d": "dd", "H": "HH", "M": "mm", "S": "ss", "f": "SSSSSS"}


def java_pattern(strftime: str) -> str:
    """A strftime format as a Java date pattern.

    >>> java_pattern("%Y-%m-%dT%H:%M:%SZ")
    "yyyy-MM-dd'T'HH:mm:ss'Z'"
    """
    out, literal_text, i = [], "", 0
    while i < len(strftime):
        if not strftime[i].isalpha() and strftime[i] not in "%'":
            out.append(literal_text and "'" + literal_text + "'")
            out.append(strftime[i])
            literal_text, i = "", i + 1
        elif strftime[i] == "%" and i + 1 < len(strftime):
            code = strftime[i + 1]
            if code not in _STRFTIME:
                raise UntranslatableSQL(f"strftime code %{code}")
            if literal_text:
                out.append("'" + literal_text.replace("'", "''") + "'")
                literal_text = ""
            out.append(_STRFTIME[code])
            i += 2
        else:
            literal_text += strftime[i]
            i += 1
    if literal_text:
        out.append("'" + literal_text.replace("'", "''") + "'")
    return "".join(out)


def _date_diff(node: exp.DateDiff, _aliases) -> exp.Expr:
    """DuckDB's date_diff counts unit boundaries crossed (Spark's, whole units elapsed)."""
    from sqlglot import exp

    per = {"MICROSECOND": 1, "MILLISECOND": 1000, "SECOND": 1_000_000}
    unit = node.args["unit"].name.upper() if isinstance(node.args.get("unit"), exp.Var) else ""
    unit = unit.removesuffix("S")
    if unit not in per:
        raise UntranslatableSQL(f"date_diff in unit {node.args.get('unit')}")

    def units(t: exp.Expr) -> exp.Expr:
        micros = exp.Anonymous(this="UNIX_MICROS", expressions=[t.copy()])
        if per[unit] == 1:
            return micros
        return exp.Floor(this=exp.Div(this=micros, expression=exp.Literal.number(per[unit])))

    # Parenthesised: the difference replaces one operand of whatever holds the call.
    return exp.Paren(this=exp.Sub(this=units(node.this), expression=units(node.expression)))


def _casts(node: exp.Cast, _aliases) -> exp.Expr:
    """A JSON value is text in the Spark tables: a cast to JSON keeps the text as it is."""
    from sqlglot import exp

    if node.to.this == exp.DataType.Type.JSON:
        return exp.cast(node.this, exp.DataType.build("STRING"))
    nested = node.to.this in (
        exp.DataType.Type.ARRAY,
        exp.DataType.Type.STRUCT,
        exp.DataType.Type.MAP,
    )
    if nested and not isinstance(node.this, exp.Null):
        # Our SQL casts JSON text to a nested type to parse it; Spark parses with from_json.
        spark_type = node.to.sql(dialect=spark_dialect())
        return exp.Anonymous(
            this="FROM_JSON", expressions=[node.this, exp.Literal.string(spark_type)]
        )
    return node


def _rowid(node: exp.Column, _aliases) -> exp.Expr:
    from sqlglot import exp

    if node.name.lower() == "rowid" and not node.this.quoted:
        return exp.Column(this=exp.to_identifier(ROWID), table=node.args.get("table"))
    return node


def _epoch_ms(node: exp.UnixToTime, _aliases) -> exp.Expr:
    """sqlglot reads epoch_ms(x) as a number to a timestamp; our SQL only takes the epoch of
    a timestamp (DuckDB's other overload), in whole milliseconds, rounded."""
    from sqlglot import exp

    scale = node.args.get("scale")
    number = isinstance(node.this, exp.Literal) or (
        isinstance(node.this, exp.Cast) and node.this.to.is_type(*exp.DataType.INTEGER_TYPES)
    )
    if isinstance(scale, exp.Literal) and scale.this == "3" and not number:
        # DuckDB rounds to the nearest millisecond (half away from zero); Spark's unix_millis
        # truncates. Exact in decimal arithmetic.
        micros = exp.cast(
            exp.Anonymous(this="UNIX_MICROS", expressions=[node.this]),
            exp.DataType.build("DECIMAL(20, 0)"),
        )
        millis = exp.Round(
            this=exp.Div(this=micros, expression=exp.Literal.number(1000)),
            decimals=exp.Literal.number(0),
        )
        return exp.cast(millis, exp.DataType.build("BIGINT"))
    raise UntranslatableSQL(f"{node.sql('duckdb')}: a number to a timestamp")


def _format(node: exp.Format, _aliases) -> exp.Expr:
    """``format('{}')`` (fmt) -> ``format_string('%s')``."""
    from sqlglot import exp

    fmt = _constant_text(node.this)
    if fmt is None or "{:" in fmt:
        raise UntranslatableSQL("format() needs a literal pattern of plain {} holes")
    pattern = fmt.replace("%", "%%").replace("{}", "%s")
    text = exp.Anonymous(
        this="FORMAT_STRING", expressions=[exp.Literal.string(pattern), *node.expressions]
    )
    if not node.expressions:
        return text
    # DuckDB's format is NULL when an argument is; Spark's writes "null" in its place.
    any_null = exp.or_(*[exp.Is(this=a.copy(), expression=exp.Null()) for a in node.expressions])
    return exp.If(this=any_null, true=exp.Null(), false=text)


def _constant_text(node: exp.Expr) -> str | None:
    """The text of a string literal, or of literals joined by ``||``; else None."""
    from sqlglot import exp

    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    if isinstance(node, exp.DPipe):
        left, right = _constant_text(node.this), _constant_text(node.expression)
        return None if left is None or right is None else left + right
    return None


def _regexp_full_match(node: exp.RegexpFullMatch, _aliases) -> exp.Expr:
    from sqlglot import exp

    pattern = node.expression
    if not isinstance(pattern, exp.Literal):
        raise UntranslatableSQL("regexp_full_match with a pattern that is not a literal")
    return exp.RegexpLike(this=node.this, expression=exp.Literal.string(f"^(?:{pattern.this})$"))


def _length(node: exp.Length, _aliases) -> exp.Expr:
    """DuckDB's len() takes a string or a list; Spark's length() only a string."""
    from sqlglot import exp

    arg = node.this
    lists = (exp.Array, exp.ArrayAgg, exp.ArrayDistinct, exp.Filter, exp.Flatten, exp.ArrayFilter)
    named = isinstance(arg, exp.Anonymous) and arg.name.lower().startswith(("list_", "json_keys"))
    if isinstance(arg, lists) or named:
        return exp.Anonymous(this="SIZE", expressions=[arg])
    return node


def _unix_micros(node: exp.Anonymous) -> exp.Expr:
    from sqlglot import exp

    return exp.Anonymous(this="UNIX_MICROS", expressions=node.expressions)


def _to_microseconds(node: exp.Anonymous) -> exp.Expr:
    """An interval of n microseconds."""
    from sqlglot import exp

    one = exp.Interval(this=exp.Literal.string("0.000001"), unit=exp.Var(this="SECOND"))
    return exp.Paren(this=exp.Mul(this=exp.Paren(this=node.expressions[0]), expression=one))


def _subscript(node: exp.Bracket, _aliases) -> exp.Expr:
    """A list subscript, 1-based in DuckDB and NULL out of range: Spark's try_element_at.
    (sqlglot stores a literal index already 0-based, an expression as written.)"""
    from sqlglot import exp

    if len(node.expressions) != 1:
        raise UntranslatableSQL("a list slice")
    index = node.expressions[0]
    if isinstance(index, exp.Slice):
        raise UntranslatableSQL("a list slice")
    if isinstance(index, exp.Literal) and index.is_string:
        return node  # a struct field or map key
    if isinstance(index, exp.Literal):
        index = exp.Literal.number(int(index.this) + 1)
    else:
        index = exp.cast(index, exp.DataType.build("INT"))
    return exp.Anonymous(this="TRY_ELEMENT_AT", expressions=[node.this, index])


def _row_number(node: exp.Window, _aliases) -> exp.Expr:
    """``row_number() OVER ()`` numbers rows in the order they are stored; Spark has no such
    order beyond its partitions', which monotonically_increasing_id follows."""
    from sqlglot import exp

    empty = not node.args.get("partition_by") and not node.args.get("order")
    if isinstance(node.this, exp.RowNumber) and empty:
        return exp.Anonymous(this="MONOTONICALLY_INCREASING_ID", expressions=[])
    return node


def _time_bucket(node: exp.DateBin, _aliases) -> exp.Expr:
    """``time_bucket(INTERVAL n unit, t)`` for a width dividing a day: DuckDB's default
    origin (2000-01-03) is then on the same grid as the epoch, so the bucket is the epoch
    floored to the width."""
    from sqlglot import exp

    width = node.this
    seconds = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600}
    unit = width.args.get("unit").name.upper().removesuffix("S") if width.args.get("unit") else ""
    if not isinstance(width, exp.Interval) or unit not in seconds or node.args.get("origin"):
        raise UntranslatableSQL("time_bucket other than a whole number of seconds")
    micros = int(width.this.this) * seconds[unit] * 1_000_000
    if 86_400_000_000 % micros:
        raise UntranslatableSQL("time_bucket of a width that does not divide a day")
    at = exp.Anonymous(this="UNIX_MICROS", expressions=[node.expression])
    floored = exp.Mul(
        this=exp.Floor(this=exp.Div(this=at, expression=exp.Literal.number(micros))),
        expression=exp.Literal.number(micros),
    )
    return exp.Anonymous(this="TIMESTAMP_MICROS", expressions=[floored])


def _divide(node: exp.Div, _aliases) -> exp.Expr:
    """DuckDB's ``/`` is a division of doubles (of integers and decimals too), and by zero
    IEEE (inf, -inf, nan); Spark's keeps decimals decimal and is NULL by zero."""
    import sqlglot
    from sqlglot import exp

    node = exp.Div(
        this=exp.cast(node.this.copy(), exp.DataType.build("DOUBLE")),
        expression=node.expression.copy(),
    )
    divisor = node.expression
    if isinstance(divisor, exp.Literal) and not divisor.is_string and float(divisor.this) != 0:
        return node
    by_zero = sqlglot.parse_one(
        "CASE WHEN __a > 0 THEN CAST('inf' AS DOUBLE) WHEN __a < 0 THEN CAST('-inf' AS DOUBLE)"
        " WHEN __a = 0 THEN CAST('nan' AS DOUBLE) END",
        read="spark",
    ).transform(lambda n: node.this.copy() if isinstance(n, exp.Column) and n.name == "__a" else n)
    is_zero = exp.EQ(this=divisor.copy(), expression=exp.Literal.number(0))
    return exp.If(this=is_zero, true=by_zero, false=node.copy())


@functools.cache
def _rules():
    from sqlglot import exp

    return [
        (exp.Join, _asof),
        (exp.ArrayAgg, _ordered_list),
        (exp.ArgMin, _whole_row_arg),
        (exp.ArgMax, _whole_row_arg),
        (exp.Log, _log),
        (exp.TimeToStr, _strftime),
        (exp.DateDiff, _date_diff),
        (exp.Cast, _casts),
        (exp.Column, _rowid),
        (exp.UnixToTime, _epoch_ms),
        (exp.Format, _format),
        (exp.RegexpFullMatch, _regexp_full_match),
        (exp.Length, _length),
        (exp.Bracket, _subscript),
        (exp.Window, _row_number),
        (exp.DateBin, _time_bucket),
        (exp.Div, _divide),
    ]


def _list_position(node: exp.Anonymous) -> exp.Expr:
    """DuckDB's list_position is NULL for a value not in the list; Spark's is 0."""
    from sqlglot import exp

    found = exp.Anonymous(this="ARRAY_POSITION", expressions=node.expressions)
    return exp.Nullif(this=found, expression=exp.Literal.number(0))


_FUNCTIONS = {
    "epoch_us": _unix_micros,
    "to_microseconds": _to_microseconds,
    "list_position": _list_position,
}
