"""DuckDB SQL as Spark SQL: each rewrite the pipeline's SQL needs, and the refusals.

These run without Spark: they check the text written. tests/test_spark.py runs the same
constructs on both engines and compares the values.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

pytest.importorskip("sqlglot", reason="the Spark translation needs sqlglot (the [spark] extra)")

from forensics.dialect import (  # noqa: E402
    UntranslatableSQL,
    java_pattern,
    parse_macros,
    spark_tree,
    to_spark,
)


@pytest.mark.parametrize(
    ("duckdb", "spark"),
    [
        (
            "SELECT * FROM a ASOF LEFT JOIN b ON a.n = b.n AND a.t >= b.t",
            "SELECT * FROM a LEFT ASOF JOIN b MATCH_CONDITION (a.t >= b.t) ON a.n = b.n",
        ),
        (
            "SELECT * FROM a ASOF JOIN b ON a.t < b.t",
            "SELECT * FROM a ASOF JOIN b MATCH_CONDITION (a.t < b.t) ON TRUE",
        ),
        (
            "SELECT list(x ORDER BY y, z) FROM t",
            "SELECT TRANSFORM(ARRAY_SORT(COLLECT_LIST(STRUCT(y AS __k0, z AS __k1, x AS __v))),"
            " __e -> __e.__v) FROM t",
        ),
        (
            "SELECT list(x) FROM t",
            "SELECT TRANSFORM(COLLECT_LIST(STRUCT(x AS __v)), __e -> __e.__v) FROM t",
        ),
        (
            "SELECT arg_min(l, (l.a, l.b)) FROM t l",
            "SELECT MIN_BY(STRUCT(l.*), STRUCT(l.a AS __k0, l.b AS __k1)) FROM t AS l",
        ),
        ("SELECT log(x), ln(x)", "SELECT LOG10(x), LN(x)"),
        (
            "SELECT strftime(t, '%Y-%m-%dT%H:%M:%SZ')",
            "SELECT DATE_FORMAT(t, 'yyyy-MM-dd\\'T\\'HH:mm:ss\\'Z\\'')",
        ),
        (
            "SELECT date_diff('millisecond', a, b)",
            "SELECT (FLOOR(UNIX_MICROS(b) / 1000) - FLOOR(UNIX_MICROS(a) / 1000))",
        ),
        ("SELECT date_diff('microsecond', a, b)", "SELECT (UNIX_MICROS(b) - UNIX_MICROS(a))"),
        (
            "SELECT date_diff('millisecond', a, b) / 1000.0",
            "SELECT CAST((FLOOR(UNIX_MICROS(b) / 1000) - FLOOR(UNIX_MICROS(a) / 1000)) AS DOUBLE)"
            " / 1000.0",
        ),
        ("SELECT x::JSON", "SELECT CAST(x AS STRING)"),
        (
            "SELECT CAST(e AS STRUCT(a INTEGER)[])",
            "SELECT FROM_JSON(e, 'ARRAY<STRUCT<a: INT>>')",
        ),
        ("SELECT NULL::BIGINT[]", "SELECT CAST(NULL AS ARRAY<BIGINT>)"),
        ("SELECT l.rowid FROM t l", "SELECT l.__rowid FROM t AS l"),
        (
            "SELECT epoch_ms(t), epoch_us(t)",
            "SELECT CAST(ROUND(CAST(UNIX_MICROS(t) AS DECIMAL(20, 0)) / 1000, 0) AS BIGINT),"
            " UNIX_MICROS(t)",
        ),
        ("SELECT t - to_microseconds(5)", "SELECT t - ((5) * INTERVAL '0.000001' SECOND)"),
        (
            "SELECT format('{} of {}%', a, b)",
            "SELECT IF(a IS NULL OR b IS NULL, NULL, FORMAT_STRING('%s of %s%%', a, b))",
        ),
        (
            "SELECT format('a {}' || ' b {}', x, y)",
            "SELECT IF(x IS NULL OR y IS NULL, NULL, FORMAT_STRING('a %s b %s', x, y))",
        ),
        ("SELECT regexp_full_match(a, 'x+')", "SELECT a RLIKE '^(?:x+)$'"),
        ("SELECT len(list_distinct(l)), len(s)", "SELECT SIZE(ARRAY_DISTINCT(l)), LENGTH(s)"),
        (
            "SELECT l[1], l[i], s['k']",
            "SELECT TRY_ELEMENT_AT(l, 1), TRY_ELEMENT_AT(l, CAST(i AS INT)), s['k']",
        ),
        (
            "SELECT list_position(['a', 'b'], c)",
            "SELECT NULLIF(ARRAY_POSITION(ARRAY('a', 'b'), c), 0)",
        ),
        (
            "SELECT row_number() OVER () AS n FROM t",
            "SELECT MONOTONICALLY_INCREASING_ID() AS n FROM t",
        ),
        (
            "SELECT time_bucket(INTERVAL 10 MINUTE, t)",
            "SELECT TIMESTAMP_MICROS(FLOOR(UNIX_MICROS(t) / 600000000) * 600000000)",
        ),
    ],
)
def test_duckdb_constructs_become_their_spark_equivalents(duckdb, spark):
    assert to_spark(duckdb) == spark


def test_a_star_replace_is_written_out_from_the_schema():
    tree = spark_tree(
        "SELECT x.* REPLACE (x.a + 1 AS a) FROM t x", schema={"t": {"a": "INT", "b": "INT"}}
    )
    assert tree.sql("spark") == "SELECT x.a + 1 AS a, x.b AS b FROM t AS x"


@pytest.mark.parametrize(
    ("duckdb", "refusal"),
    [
        ("SELECT * REPLACE (1 AS a) FROM t", "needs the tables' columns"),
        ("SELECT * FROM a ASOF JOIN b ON a.n = b.n", "exactly one inequality"),
        ("SELECT format('{:,}', x)", "plain {} holes"),
        ("SELECT format(p, x)", "plain {} holes"),
        ("SELECT date_diff('day', a, b)", "date_diff in unit DAY"),
        ("SELECT time_bucket(INTERVAL 7 MINUTE, t)", "does not divide a day"),
        ("SELECT time_bucket(INTERVAL 1 DAY, t)", "whole number of seconds"),
        ("SELECT strftime(t, '%j')", "strftime code %j"),
        ("SELECT list(x ORDER BY y DESC) FROM t", "DESC or NULLS FIRST"),
        ("SELECT epoch_ms(1700000000000)", "a number to a timestamp"),
        ("SELECT l[1:2]", "a list slice"),
        ("SELECT $missing", "no value for parameter $missing"),
    ],
)
def test_what_has_no_faithful_translation_is_refused_by_name(duckdb, refusal):
    with pytest.raises(UntranslatableSQL, match=refusal.replace("$", r"\$")):
        to_spark(duckdb)


def test_parameters_become_literals():
    when = datetime(2026, 8, 27, 12, 0, tzinfo=UTC)
    sql = to_spark(
        "SELECT $n, $x, $s, $b, $l, $t, $none",
        {"n": 3, "x": 0.5, "s": "it's", "b": False, "l": ["a"], "t": when, "none": None},
    )
    assert sql == (
        "SELECT 3, 0.5, 'it\\'s', FALSE, ARRAY('a'), CAST('2026-08-27 12:00:00Z' AS TIMESTAMP),"
        " NULL"
    )
    assert to_spark("INSERT INTO t VALUES (?, ?)", [1, "a"]) == "INSERT INTO t VALUES (1, 'a')"
    with pytest.raises(UntranslatableSQL, match="naive datetime"):
        to_spark("SELECT $t", {"t": datetime(2026, 8, 27)})


def test_macros_expand_in_place_nested_and_as_tables():
    macros = parse_macros(
        """CREATE MACRO inner_rule(x) AS x + 1;
           CREATE MACRO outer_rule(a, b) AS inner_rule(a) * b;
           CREATE MACRO picked(t) AS TABLE SELECT * FROM query_table(t) WHERE k > 0;"""
    )
    assert to_spark("SELECT outer_rule(c, 2) FROM t", macros=macros) == (
        "SELECT ((((c)) + 1) * (2)) FROM t"
    )
    assert to_spark("SELECT * FROM picked('legs') p", macros=macros) == (
        "SELECT * FROM (SELECT * FROM legs WHERE k > 0) AS p"
    )
    with pytest.raises(UntranslatableSQL, match="takes 2 arguments, got 1"):
        to_spark("SELECT outer_rule(c)", macros=macros)
    with pytest.raises(UntranslatableSQL, match="query_table needs a table name"):
        to_spark("SELECT * FROM picked(name_column)", macros=macros)


def test_java_patterns_quote_literal_letters():
    assert java_pattern("%Y-%m-%d %H:%M:%S.%f") == "yyyy-MM-dd HH:mm:ss.SSSSSS"
    assert java_pattern("%Hh at T") == "HH'h' 'at' 'T'"


def test_every_statement_of_the_pipeline_translates():
    """Every SQL file the pipeline runs and every detector: a construct added later with no
    translation fails here, by file, rather than on a responder's cluster."""
    import duckdb

    from forensics.detectors import load_detectors
    from forensics.sql import SQL_DIR
    from forensics.verdicts import vocabulary_macros

    macros = parse_macros(
        ";\n".join(vocabulary_macros()) + ";\n" + (SQL_DIR / "rules.sql").read_text()
    )
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        macros |= parse_macros(text)
        for statement in duckdb.connect().extract_statements(text):
            values = dict.fromkeys(statement.named_parameters, 1)
            assert _translates(statement.query, values, macros), path.name
    for det in load_detectors():
        assert _translates(det.sql.rstrip().rstrip(";"), det.defaults(), macros), det.id


def _translates(sql, values, macros) -> bool:
    try:
        return bool(to_spark(sql, values, macros))
    except UntranslatableSQL as exc:
        # A `* REPLACE` is written out against the tables as they are when it runs: Spark
        # runs those statements in tests/test_spark.py.
        if "needs the tables' columns" in str(exc):
            return True
        raise
