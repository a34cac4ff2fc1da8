"""Detection on Spark gives what DuckDB gives: the same outputs, byte for byte, on simulated
cases with every kind of evidence, and each translated construct the same value on both.

Spark runs in local mode (``local[2]``) in this process. Without pyspark or a Java runtime
these tests skip, saying which is missing; CI installs both (.ci/run).
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forensics.cli import app

pytest.importorskip("pyspark", reason='the Spark engine needs pyspark: pip install ".[spark]"')
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("the Spark engine needs a Java 17+ runtime (none on PATH)", allow_module_level=True)

OUTPUTS = ("affected_responses.csv", "exposures.csv", "notifications.csv")


@pytest.fixture(scope="module")
def spark():
    """One local Spark for the module: detection reuses a running session, and leaves it."""
    from forensics.spark import start_session

    session = start_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def workspace(spark):
    from forensics.db import install_macros
    from forensics.spark import SparkWorkspace

    ws = SparkWorkspace(spark)
    install_macros(ws)
    return ws


def _simulate(folder: Path, *args: str) -> Path:
    result = CliRunner().invoke(app, ["simulate", str(folder), "--seed", "5", *args])
    assert result.exit_code == 0, result.output
    return folder


def _run(case: Path, out: Path, *engine: str) -> None:
    result = CliRunner().invoke(app, ["run", str(case), "--out", str(out), *engine])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("simulated", "removed"),
    [
        # Client log, engine legs, pool snapshots, tenants and the decode allocation log,
        # with a customer probing the limit: every kind of evidence, exact attribution.
        (("canonical", "--kv-allocations", "--probers", "binary_search"), ()),
        # SGLang's own logs only: engine requests with no client record, replayed pools.
        (("sglang",), ()),
        # The decode legs lost: pools replayed from client times, where a request the pool
        # cannot hold waits for room (its exposures differ from a replay without the wait).
        (("canonical",), ("evidence/engine_legs-decode.parquet",)),
    ],
    ids=["every-kind", "engine-logs-only", "decode-legs-lost"],
)
def test_spark_writes_the_outputs_duckdb_writes(spark, tmp_path, simulated, removed, monkeypatch):
    # Findings come back in pieces of 40 rows here (100,000 in use), so every large table is
    # copied in several: the outputs do not depend on how it was cut.
    monkeypatch.setattr("forensics.sparkerrors.PIECE_ROWS", 40)
    fmt, *extra = simulated
    case = _simulate(tmp_path / "case", "--requests", "3000", "--format", fmt, *extra)
    for name in removed:
        (case / name).unlink()
    _run(case, tmp_path / "duckdb")
    _run(case, tmp_path / "spark", "--engine", "spark", "--spark-master", "local[2]")
    affected = (tmp_path / "duckdb" / "affected_responses.csv").read_text().splitlines()
    assert len(affected) > 1, "the simulated case must have affected responses to compare"
    for name in OUTPUTS:
        duck = (tmp_path / "duckdb" / name).read_bytes()
        assert (tmp_path / "spark" / name).read_bytes() == duck, name
    # And the rest of the report.
    _same_report(tmp_path / "duckdb", tmp_path / "spark")
    # The copy of the evidence Spark read does not outlive the run.
    assert not (case / "case.duckdb.spark").exists()


def _same_report(duck: Path, spark: Path) -> None:
    """Every file of the two reports the same (the findings tables by content), but for the
    line saying where detection ran, and manifest.json, which says it too and holds the two
    report files' checksums."""
    import json

    import pyarrow.parquet as pq

    written = sorted(p.relative_to(duck) for p in duck.rglob("*"))
    assert written == sorted(p.relative_to(spark) for p in spark.rglob("*"))
    said = {
        "report.html": ' · <span id="engine">detection on Spark (<code>local[2]</code>)</span>',
        "report.md": " · detection on Spark (`local[2]`)",
    }
    for name in written:
        duck_file, spark_file = duck / name, spark / name
        if duck_file.suffix == ".parquet":
            assert pq.read_table(spark_file).equals(pq.read_table(duck_file)), name
        elif str(name) in said:
            spark_text = spark_file.read_text()
            assert spark_text.count(said[str(name)]) == 1, name
            assert spark_text.replace(said[str(name)], "") == duck_file.read_text(), name
        elif str(name) == "manifest.json":
            duck_doc = json.loads(duck_file.read_text())
            spark_doc = json.loads(spark_file.read_text())
            assert duck_doc.pop("detection_engine") == {"name": "duckdb"}
            assert spark_doc.pop("detection_engine") == {"name": "spark", "master": "local[2]"}
            for doc in (duck_doc, spark_doc):
                doc["outputs"] = [o for o in doc["outputs"] if o["path"] not in said]
            assert spark_doc == duck_doc
        elif duck_file.is_file():
            assert spark_file.read_bytes() == duck_file.read_bytes(), name


# Each construct the translation rewrites, on values where DuckDB and a naive translation
# differ: boundaries, NULLs, absent values, order.
CONSTRUCTS = [
    "date_diff('millisecond', a, b)",
    "date_diff('millisecond', a, b) / 1000.0",
    "2 * date_diff('microsecond', a, b) - 1",
    "date_diff('microsecond', a, b)",
    "epoch_ms(a)",
    "epoch_us(b)",
    "time_bucket(INTERVAL 10 MINUTE, b)",
    "strftime(a, '%Y-%m-%dT%H:%M:%SZ')",
    "log(n)",
    "format('{} of {}', n, s)",
    "regexp_full_match(s, 'x+')",
    "[10, 20][i]",
    "list_position(['x', 'xx'], s)",
    "a - to_microseconds(n * 1000)",
    "n // 3",
    "n / 0",
]


def test_each_translated_construct_has_the_value_duckdb_gives(workspace):
    import duckdb

    rows = [
        (
            datetime(2026, 8, 27, 12, 0, 0, 999_900, UTC),
            datetime(2026, 8, 27, 12, 0, 1, 100, UTC),
            1000,
            "xx",
            1,
        ),
        (
            datetime(2026, 8, 27, 12, 9, 59, 0, UTC),
            datetime(2026, 8, 27, 12, 10, 0, 1, UTC),
            7,
            "y",
            3,
        ),
        (
            datetime(2026, 8, 27, 23, 59, 59, 500_000, UTC),
            datetime(2026, 8, 28, 0, 0, 0, 0, UTC),
            1,
            None,
            2,
        ),
    ]
    values = "VALUES " + ", ".join(
        f"(TIMESTAMPTZ '{a.isoformat()}', TIMESTAMPTZ '{b.isoformat()}', {n}, "
        f"{'NULL' if s is None else repr(s)}, {i})"
        for a, b, n, s, i in rows
    )
    setup = f"CREATE OR REPLACE TEMP TABLE probe AS SELECT * FROM ({values}) v(a, b, n, s, i)"
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(setup)
    workspace.execute(setup)
    for construct in CONSTRUCTS:
        query = f"SELECT {construct} AS v FROM probe ORDER BY n"
        duck = [r[0] for r in con.execute(query).fetchall()]
        spark = [r[0] for r in workspace.execute(query).fetchall()]
        assert spark == duck, construct


def test_legs_admitted_together_are_placed_as_duckdb_places_them(workspace):
    # The decode timeline's first-in-first-out placement of legs allocated together (windows
    # over timestamps, intervals of microseconds, a rank that is NULL): three legs of one
    # admission whose rebuilt times tie and run against their queue entries, a fourth whose
    # entry lies within 100 us of one of theirs (a queue run), two more 100 us apart, one with
    # no wait logged, and an admission on a rank no log names.
    import duckdb

    from forensics.sql import run_sql_file

    def leg(rid, rank, at_us, wait_s=None):
        extra = "NULL" if wait_s is None else f"'{{\"prealloc_wait_s\": {wait_s}}}'"
        rank_sql = "NULL" if rank is None else str(rank)
        at = f"TIMESTAMPTZ '2026-08-28 10:00:10+00' + to_microseconds({at_us})"
        return (
            f"('{rid}', 'decode', 'd0', {rank_sql}::BIGINT, {at}, "
            f"TIMESTAMPTZ '2026-08-28 10:01:00+00', 100::BIGINT, NULL::VARCHAR, {extra}::VARCHAR)"
        )

    legs = [
        leg("a", 0, 5, 1.0),  # entered third
        leg("b", 0, 5, 3.0),  # entered first
        leg("c", 0, 6, 2.0),
        leg("i", 0, 20, 2.00005),  # entered 36 us before c: their order is not settled
        leg("d", 0, 300, 9.0),  # 100 us and more from the rest: as logged
        leg("e", 0, 400, 0.5),
        leg("f", 0, 410),  # no wait logged: as logged
        leg("g", None, 7, 0.1),
        leg("h", None, 9, 4.0),
    ]
    setup = [
        "CREATE OR REPLACE TEMP TABLE matched_legs AS SELECT * FROM (VALUES "
        + ", ".join(legs)
        + ") v(client_request_id, role, node, dp_rank, started_at, finished_at, reserved_tokens,"
        " error, extra)",
        "CREATE OR REPLACE TEMP TABLE all_requests AS SELECT client_request_id AS request_id,"
        " 'acct' AS tenant_id, node AS decode_node, dp_rank, started_at AS received_at,"
        " finished_at AS completed_at, 50000.0 AS e2e_ms, 100::BIGINT AS prompt_tokens,"
        " 4::BIGINT AS completion_tokens, started_at AS first_token_at, 1.0 AS ttft_ms,"
        " true AS client_record, 200::BIGINT AS http_status FROM matched_legs",
    ]
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for target in (con, workspace):
        for statement in setup:
            target.execute(statement)
        run_sql_file(target, "timeline.sql")
    query = """SELECT request_id, dp_rank, epoch_us(alloc_at) - epoch_us(TIMESTAMPTZ
               '2026-08-28 10:00:10+00') AS at_us, queue_run FROM decode_timeline ORDER BY ALL"""
    duck = con.execute(query).fetchall()
    runs = {rid: run for rid, _, _, run in duck}
    assert runs["c"] is not None and runs["c"] == runs["i"]
    assert [rid for rid, run in runs.items() if run is not None] == ["c", "i"]
    assert workspace.execute(query).fetchall() == duck
    placed = [r[:3] for r in duck]
    # b, i, c, a entered in that order and take the admission's instants (5, 6, 7, 20) so.
    assert sorted(placed, key=lambda r: (r[1] is not None, r[1], r[2])) == [
        ("h", None, 7),
        ("g", None, 9),
        ("b", 0, 5),
        ("i", 0, 6),
        ("c", 0, 7),
        ("a", 0, 20),
        ("d", 0, 300),
        ("e", 0, 400),
        ("f", 0, 410),
    ]


def test_lists_keep_duckdb_order_and_nulls(workspace):
    import duckdb

    setup = """CREATE OR REPLACE TEMP TABLE items AS
               SELECT * FROM (VALUES ('a', 3, 'c'), ('a', 1, NULL), ('a', 2, 'b'), ('b', 1, 'z'))
               v(k, o, x)"""
    query = """SELECT k, list(x ORDER BY o) AS xs, arg_min(t, (t.o, t.x)).x AS first
               FROM items t GROUP BY k ORDER BY k"""
    con = duckdb.connect()
    con.execute(setup)
    workspace.execute(setup)
    assert workspace.execute(query).fetchall() == con.execute(query).fetchall()


def test_a_table_changes_as_duckdb_changes_it(workspace):
    """INSERT, UPDATE ... FROM, DELETE and DROP on a Spark workspace table."""
    ws = workspace
    ws.execute("CREATE OR REPLACE TABLE marks (id VARCHAR, n BIGINT, note VARCHAR)")
    ws.execute("INSERT INTO marks VALUES ($a, $n, NULL)", {"a": "r1", "n": 1})
    ws.executemany("INSERT INTO marks VALUES (?, ?, ?)", [["r2", 2, None], ["r3", 3, "x"]])
    ws.execute(
        """UPDATE marks m SET note = u.note FROM (SELECT 'r2' AS id, 'two' AS note) u
           WHERE m.id = u.id"""
    )
    ws.execute("DELETE FROM marks WHERE n >= 3")
    assert ws.execute("SELECT id, n, note FROM marks ORDER BY id").fetchall() == [
        ("r1", 1, None),
        ("r2", 2, "two"),
    ]
    ws.execute("DROP TABLE marks")
    assert "marks" not in ws.tables


def test_many_rows_of_values_are_all_inserted(workspace, monkeypatch):
    """A VALUES list of several rows, and executemany over more rows than one statement
    takes: every row lands, typed by the table."""
    import forensics.spark

    monkeypatch.setattr(forensics.spark, "_ROWS_PER_INSERT", 3)
    ws = workspace
    ws.execute("CREATE OR REPLACE TABLE counts (tenant VARCHAR, n BIGINT, share DOUBLE)")
    ws.execute("INSERT INTO counts VALUES ('a', 1, NULL), ('b', NULL, 0.5)")
    ws.executemany("INSERT INTO counts VALUES (?, ?, ?)", [[f"t{i}", i, i / 4] for i in range(7)])
    rows = ws.execute("SELECT tenant, n, share FROM counts ORDER BY tenant").fetchall()
    assert rows == [("a", 1, None), ("b", None, 0.5)] + [(f"t{i}", i, i / 4) for i in range(7)]


def test_a_registered_arrow_table_keeps_every_row(workspace):
    """A table made of pieces, some empty (exposures filtered rank by rank), and an empty
    table: every row is there, and the columns of the empty one."""
    import pyarrow as pa

    piece = pa.table({"id": ["a", "b"], "n": pa.array([1, 2], pa.int64())})
    pieces = pa.concat_tables([piece, piece.slice(0, 0), piece, piece.slice(0, 0), piece])
    workspace.register("pieces", pieces)
    assert workspace.execute("SELECT count(*), sum(n) FROM pieces").fetchall() == [(6, 9)]
    workspace.register("nothing", piece.slice(0, 0))
    assert workspace.execute("SELECT count(*) FROM nothing").fetchall() == [(0,)]
    assert workspace.session.table("nothing").columns == ["id", "n"]


def test_a_spark_that_cannot_start_is_one_line(tiny_case_dir):
    """No JVM stack trace: which master, and what to check. (Its own process: this one's
    Spark is running.)"""
    import subprocess
    import sys

    assert CliRunner().invoke(app, ["ingest", str(tiny_case_dir)]).exit_code in (0, 1)
    env = dict(os.environ, JAVA_HOME=str(tiny_case_dir / "no-such-jdk"), PATH="/usr/bin:/bin")
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "forensics.cli", "detect", str(tiny_case_dir), "--engine", "spark"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("Error: Spark did not start on local[*]: ")
    assert "Java 17+ runtime" in errors[0]
    assert "Traceback" not in done.stderr


def _python_in_a_fresh_process(script: str):
    """Run ``script`` in a new Python (a Spark started with settings of its own, or watched
    from its start), without this process's Spark submit arguments; it must succeed."""
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done


def test_spark_starts_without_chatter():
    """Spark's start-up lines ("Setting default log level...") would bury ours: a fresh process
    that starts Spark and runs a job prints nothing of Spark's on stderr but the Java
    runtime's own notice of the module Spark asks for."""
    done = _python_in_a_fresh_process(
        "from forensics.spark import start_session\n"
        "print(start_session('local[1]').range(5).count())\n"
    )
    assert done.stdout == "5\n"
    spoken = [
        line for line in done.stderr.splitlines() if not line.startswith("WARNING: Using incubator")
    ]
    assert spoken == []


def test_a_failed_statement_names_it_in_one_line(workspace):
    from forensics.spark import SparkError

    workspace.execute("CREATE OR REPLACE TEMP TABLE known AS SELECT 1 AS n")
    with pytest.raises(SparkError) as err:
        workspace.execute("SELECT no_such_column FROM known")
    message = str(err.value)
    assert "UNRESOLVED_COLUMN" in message and "(in: SELECT no_such_column FROM known)" in message
    assert "\n" not in message


def test_progress_names_the_spark_stage_running(spark):
    """A Spark action blocks its thread; the line still says which stage runs and how far."""
    from forensics.spark import StageWatch

    lines: list[str] = []
    watch = StageWatch(spark, lambda what, done, total: lines.append(what), every=0.1)
    watch.step("Detector over_pool", 0, 5)
    spark.range(0, 300_000_000, numPartitions=16).selectExpr("sum(id % 7)").collect()
    watch.stop()
    assert lines[0] == "Detector over_pool"
    assert any(
        line.startswith("Detector over_pool (Spark stage ") and " tasks)" in line
        for line in lines[1:]
    ), lines


def test_a_failed_task_is_one_line_naming_its_cause(spark):
    """A Python error inside a Spark task (the replay runs there) reaches the user as the
    exception it ended with, not a JVM trace."""
    from pyspark.sql.functions import udf

    from forensics.sparkerrors import SparkError, to_arrow

    broken = udf(lambda n: 1 / (n - n), "double")
    with pytest.raises(SparkError) as err:
        to_arrow(spark.range(3).select(broken("id")), "the allocator replay")
    message = str(err.value)
    assert message.startswith("Python error in a Spark task: ZeroDivisionError")
    assert message.endswith("(in: the allocator replay)") and "\n" not in message


def test_a_driver_short_of_memory_says_which_setting_to_raise():
    """The 16M failure as Py4J gave it: the line is its cause, and the flag that helps."""
    from forensics.sparkerrors import SparkError, one_line_failures

    class Py4JJavaError(Exception):  # the name is what marks a JVM error
        pass

    trace = (
        "An error occurred while calling o16248.getResult.\n"
        ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
        "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:70)\n"
        "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 "
        "in stage 645.0 failed 1 times, most recent failure: Lost task 0.0 in stage 645.0 "
        "(TID 2556) (192.0.2.2 executor driver): TaskResultLost (result lost from block "
        "manager)\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(x.scala:1)\n"
    )
    with pytest.raises(SparkError) as err, one_line_failures("copying findings_exposures back"):
        raise Py4JJavaError(trace)
    assert str(err.value) == (
        "SparkException: Job aborted due to stage failure: Task 0 in stage 645.0 failed 1 "
        "times, most recent failure: Lost task 0.0 in stage 645.0 (TID 2556) (192.0.2.2 "
        "executor driver): TaskResultLost (result lost from block manager) (in: copying "
        "findings_exposures back); the driver (in local mode, every task too) ran short of "
        "memory: give it more with --spark-conf spark.driver.memory=4g"
    )
    # Other failures get no such advice.
    with pytest.raises(SparkError) as err, one_line_failures("SELECT 1"):
        raise Py4JJavaError("An error occurred while calling o7.sql.\n: java.io.IOException: gone")
    assert str(err.value) == "IOException: gone (in: SELECT 1)"


def test_a_large_result_comes_back_whole_in_bounded_pieces(spark):
    """Every row once, repeated rows and NULLs included, in pieces of about the size asked
    (one Spark job each), whatever the frame's partitions."""
    from collections import Counter

    from forensics.sparkerrors import arrow_pieces

    frame = spark.range(0, 1000, numPartitions=1).selectExpr(
        "id % 900 AS n",  # ids 900-999 repeat rows 0-99
        "IF(id % 7 = 0, NULL, concat('tenant-', id % 13)) AS tenant",
    )
    pieces = list(arrow_pieces(frame, "copying a test table back", rows=64))
    assert len(pieces) == 16  # ceil(1000 / 64)
    assert max(p.num_rows for p in pieces) < 2 * 64
    got = Counter(tuple(row.values()) for p in pieces for row in p.to_pylist())
    want = Counter(tuple(r) for r in frame.collect())
    assert got == want and sum(got.values()) == 1000
    # Few rows: one piece, as one job.
    assert [p.num_rows for p in arrow_pieces(spark.range(5), "a small table")] == [5]


def test_a_job_the_driver_refuses_is_one_line_naming_why():
    """A job Spark aborts on the JVM side (here: results over spark.driver.maxResultSize)
    arrives as a Py4J error whose first line names only the call ("An error occurred while
    calling o56.getResult."); the line shown is the cause. (Its own process: the limit is set
    when Spark starts.)"""
    done = _python_in_a_fresh_process(
        "from forensics.spark import start_session\n"
        "from forensics.sparkerrors import SparkError, to_arrow\n"
        "spark = start_session('local[1]', {'spark.driver.maxResultSize': '1k'})\n"
        "try:\n"
        "    to_arrow(spark.range(0, 100000, numPartitions=2), 'copying findings_exposures back')\n"
        "except SparkError as exc:\n"
        "    print(exc)\n"
    )
    assert done.stdout.startswith("SparkException: Job aborted due to stage failure: "), done.stdout
    assert "is bigger than spark.driver.maxResultSize (1024.0 B)" in done.stdout
    assert done.stdout.endswith(
        " (in: copying findings_exposures back); raise it with --spark-conf "
        "spark.driver.maxResultSize=4g\n"
    )
    assert done.stdout.count("\n") == 1


# --- evidence read where it lies (forensics.lake) -------------------------------------------


def _hard_evidence(case: Path) -> None:
    """What a real read meets, added to a simulated case: a damaged file, repeats across files
    (exact and conflicting, requests and engine legs), rows that do not load, a file with the
    bytes of another, and a pattern that matches nothing."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    evidence = case / "evidence"
    days = sorted(evidence.glob("requests-*.jsonl.gz"))
    with gzip.open(days[0], "rt") as fh:
        rows = [json.loads(line) for line in fh][:5]
    extra = [
        rows[0],
        rows[1],
        dict(rows[3], prompt_tokens=rows[3]["prompt_tokens"] + 1),
        dict(rows[4], received_at="yesterday"),
        {
            "request_id": "extra-1",
            "tenant_id": "acct_extra",
            "prompt_tokens": 10,
            "received_at": "2026-09-01T00:00:00Z",
            "http_status": 200,
        },
        {
            "request_id": "extra-2",
            "prompt_tokens": 10,
            "received_at": "2026-09-01T00:00:00Z",
            "http_status": 200,
        },
    ]
    (evidence / "more").mkdir()
    (evidence / "more" / "requests-extra.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in extra)
    )
    shutil.copy(days[1], evidence / "more" / "copy-of-day-2.jsonl.gz")
    damaged = days[-1].read_bytes()
    days[-1].write_bytes(damaged[: len(damaged) * 2 // 3])
    # Three decode legs logged again in a file of their own, the first with another
    # reservation: two exact repeats and one conflicting.
    legs = pq.read_table(evidence / "engine_legs-decode.parquet").slice(0, 3)
    copies = legs.to_pylist()
    copies[0]["reserved_tokens"] = (copies[0]["reserved_tokens"] or 0) + 1
    pq.write_table(
        pa.Table.from_pylist(copies, schema=legs.schema), evidence / "engine_legs-dup.parquet"
    )
    with (case / "case.toml").open("a") as fh:
        fh.write(
            '\n[[evidence]]\nkind = "requests"\npaths = ["evidence/more/*.jsonl*", '
            '"evidence/missing-*.jsonl"]\n'
        )


def _bookkeeping(database: Path) -> dict[str, list]:
    import duckdb

    con = duckdb.connect(str(database), read_only=True)
    try:
        # Each file by its path: a local ingest's evidence ids skip the numbers of loads it
        # retried (a batch of files, then each alone), a read in place numbers them densely.
        def by_path(table: str) -> str:
            return (
                f"SELECT e.path, t.* EXCLUDE (evidence_id) FROM {table} t "
                "JOIN evidence e USING (evidence_id) ORDER BY e.path, t.source_row"
            )

        tables = {
            "evidence": "SELECT * EXCLUDE (evidence_id, loaded_at) FROM evidence ORDER BY path",
            "evidence order": "SELECT path FROM evidence ORDER BY evidence_id",
            "rejects": "SELECT * EXCLUDE (evidence_id) FROM rejects ORDER BY path, source_row",
            "evidence_failures": "SELECT * FROM evidence_failures ORDER BY ALL",
            "pool_snapshots": by_path("pool_snapshots"),
            "tenants": by_path("tenants"),
        }
        return {name: con.execute(sql).fetchall() for name, sql in tables.items()}
    finally:
        con.close()


def test_evidence_read_in_place_gives_what_loading_it_gives(spark, tmp_path, monkeypatch):
    # The same files, loaded into the case database and detected there, or read where they
    # lie by Spark's tasks: the same files, rows, rejects and failures recorded, the same
    # report. (Rejects, findings and the rows behind them come back in pieces of 40 rows.)
    import duckdb

    monkeypatch.setattr("forensics.sparkerrors.PIECE_ROWS", 40)

    case = _simulate(tmp_path / "case", "--requests", "3000", "--kv-allocations")
    _hard_evidence(case)
    lake = tmp_path / "lake"
    shutil.copytree(case, lake)
    runner = CliRunner()
    loaded = runner.invoke(app, ["run", str(case), "--out", str(tmp_path / "duckdb")])
    read = runner.invoke(
        app,
        [
            "run",
            str(lake),
            "--out",
            str(tmp_path / "spark"),
            "--engine",
            "spark",
            "--spark-master",
            "local[2]",
            "--in-place",
        ],
    )
    # Both stop with exit 1, naming the same damaged file and missing pattern.
    assert loaded.exit_code == read.exit_code == 1, read.output
    problems = [line for line in loaded.output.splitlines() if line.startswith("Error:")]
    assert len(problems) == 2 and "missing-" in " ".join(problems)
    assert [line for line in read.output.splitlines() if line.startswith("Error:")] == problems
    ingest_line = next(line for line in loaded.output.splitlines() if line.startswith("Ingest:"))
    assert ingest_line in read.output.splitlines()
    _same_report(tmp_path / "duckdb", tmp_path / "spark")

    here, there = _bookkeeping(case / "case.duckdb"), _bookkeeping(lake / "case.duckdb")
    assert there == here
    reasons = " ".join(r[3] for r in here["rejects"])
    assert "exact duplicate" in reasons and "conflicting duplicate" in reasons
    assert "required value missing" in reasons and "not a timestamp" in reasons
    damaged = sorted((case / "evidence").glob("requests-*.jsonl.gz"))[-1]
    assert {r[0] for r in here["rejects"]} == {
        "evidence/more/requests-extra.jsonl",
        "evidence/engine_legs-dup.parquet",
        f"evidence/{damaged.name}",  # the line the damage cut
    }
    outcomes = {r[10] for r in here["evidence"]}
    assert outcomes == {"loaded", "partial"}

    # The case database holds only the rows behind the findings of what lies elsewhere, and
    # says how many rows lie there.
    con = duckdb.connect(str(lake / "case.duckdb"), read_only=True)
    held = dict(con.execute("SELECT kind, rows_loaded FROM evidence_in_place").fetchall())
    for kind in ("requests", "engine_legs", "kv_allocations"):
        held_here = con.execute(f"SELECT count(*) FROM {kind}").fetchone()[0]
        total = con.execute(
            "SELECT sum(rows_loaded) FROM evidence WHERE kind = ?", [kind]
        ).fetchone()[0]
        assert held[kind] == total > 0
        assert (0 < held_here < total / 3) if kind != "kv_allocations" else held_here == 0, kind
    con.close()
    assert not (lake / "case.duckdb.spark").exists() or not any(
        (lake / "case.duckdb.spark").iterdir()
    )
    # Detected from the database alone it would be clean: refused.
    refused = runner.invoke(app, ["detect", str(lake)])
    assert refused.exit_code == 1
    assert "the evidence of this case was read in place by Spark" in refused.output

    # The rows behind the findings are here: each affected response explains as it does from
    # a loaded case; a request no finding names is said to lie elsewhere.
    import csv

    with (tmp_path / "duckdb" / "affected_responses.csv").open() as fh:
        affected = [row["request_id"] for row in csv.DictReader(fh)]
    with (tmp_path / "duckdb" / "exposures.csv").open() as fh:
        sources = [row["source_request_id"] for row in csv.DictReader(fh)]
    for rid in affected[:3] + sources[:3]:
        told = [runner.invoke(app, ["explain", str(c), rid]) for c in (case, lake)]
        assert told[0].exit_code == told[1].exit_code == 0, told[1].output
        assert told[1].output == told[0].output.replace(str(case), str(lake))
    con = duckdb.connect(str(case / "case.duckdb"), read_only=True)
    plain = con.execute(
        "SELECT request_id FROM requests WHERE request_id NOT IN "
        "(SELECT request_id FROM findings_affected UNION SELECT request_id FROM findings_signals"
        " UNION SELECT source_request_id FROM findings_exposures"
        " UNION SELECT recipient_request_id FROM findings_exposures) LIMIT 1"
    ).fetchone()[0]
    con.close()
    unnamed = runner.invoke(app, ["explain", str(lake), plain])
    assert unnamed.exit_code == 1
    assert "is not among the requests the findings name" in " ".join(unnamed.output.split())
    counted = runner.invoke(app, ["sql", str(lake), "SELECT count(*) FROM requests"])
    assert counted.exit_code == 0
    assert "hold only the rows behind its findings here (engine_legs " in " ".join(
        counted.output.split()
    )

    # Read again after a file changed: the findings rest on the new bytes, and say so.
    tenants = lake / "evidence" / "tenants.csv"
    tenants.write_text(tenants.read_text() + "acct_new,New tenant,security@new.example\n")
    again = runner.invoke(
        app, ["detect", str(lake), "--engine", "spark", "--spark-master", "local[2]", "--in-place"]
    )
    assert again.exit_code == 0, again.output
    assert "evidence/tenants.csv: its bytes changed since the previous read" in again.output
    con = duckdb.connect(str(lake / "case.duckdb"), read_only=True)
    assert con.execute(
        "SELECT count(*) FROM findings_warnings WHERE code = 'evidence_changed'"
    ).fetchone() == (1,)
    assert _bookkeeping(lake / "case.duckdb")["rejects"] == here["rejects"]
    con.close()
