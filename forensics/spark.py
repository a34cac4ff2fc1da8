"""Detection on Apache Spark: the DuckDB statements of detection, translated and run by Spark.

``SparkWorkspace`` answers the part of DuckDB's connection interface that detection uses
(``execute``, ``sql``, ``executemany``, ``register``, ``fetchone``/``fetchall``), so the
detection code runs unchanged and its SQL is written once (``forensics.dialect`` translates it).
Spark has no mutable temporary tables, so a table here is a Spark temporary view over a
materialised DataFrame: ``CREATE TABLE`` makes an empty one, ``CREATE TABLE AS`` materialises
the query, ``INSERT`` / ``UPDATE`` / ``DELETE`` replace the view with a new DataFrame derived
from the old one (the old rows, changed, plus the new). What detection finds is small; it is
copied back into the case database (``copy_findings``), where scoping and the report read it.

pyspark is optional (``pip install "kv-forensics[spark]"``) and needs a Java 17+ runtime.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.dialect import ROWID, Macro, UntranslatableSQL, parse_macros, spark_tree
from forensics.sparkerrors import SparkError, arrow_pieces, first_line, one_line_failures, to_arrow
from forensics.sparkerrors import error_line as _error_line

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from forensics.case import Case
    from forensics.detect import DetectSummary
    from forensics.progress import StepProgress

# The case tables Spark reads: the evidence, as ingest loaded it.
EVIDENCE_TABLES = ("requests", "engine_legs", "pool_snapshots", "kv_allocations", "tenants")

# What every session needs whatever the manifest says: UTC (timestamps are stored in UTC and
# rendered by the session zone), as-of joins, and no web UI on a responder's machine.
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.join.asofJoin.enabled": "true",
    # DuckDB's to_json writes a NULL field as null; Spark leaves it out unless told.
    "spark.sql.jsonGenerator.ignoreNullFields": "false",
    # The rewrites of forensics.dialect (division by zero, list subscripts) are written, and
    # checked against DuckDB, for Spark's non-ANSI evaluation.
    "spark.sql.ansi.enabled": "false",
}
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


@functools.cache
def _package_zip() -> Path:
    """This package's Python files as a zip, for Spark executors to import (made once per
    process, however many sessions it starts)."""
    import tempfile
    import zipfile

    root = Path(__file__).resolve().parent
    target = Path(tempfile.mkdtemp(prefix="kv-forensics-")) / "forensics.zip"
    with zipfile.ZipFile(target, "w") as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".sql", ".toml", ".yml", ".j2"):
                zf.write(path, Path("forensics") / path.relative_to(root))
    return target


# Rows of parameters per statement when executemany inserts them: a statement of a thousand
# rows is parsed and planned in well under a second.
_ROWS_PER_INSERT = 1000


def detect_on_spark(
    con: duckdb.DuckDBPyConnection, case: Case, progress: StepProgress | None = None
) -> DetectSummary:
    """Run detection on Spark over the case's evidence tables and write what it found into
    the case database's findings tables, as ``forensics.detect.detect_case`` does in DuckDB.

    The evidence tables go to Spark as Parquet in the staging folder; the detection code is
    the same (``detect_case`` driving a :class:`SparkWorkspace`), so is every statement, only
    translated; the findings come back in pieces (``arrow_pieces``). Scoping and the report
    then read the case database as after a DuckDB detection.
    """
    import importlib.util

    from forensics.db import install_macros
    from forensics.detect import detect_case
    from forensics.schema import FINDINGS_DDL, SCOPE_DDL

    if importlib.util.find_spec("pyspark") is None:
        raise SparkError('the Spark engine needs pyspark: pip install "kv-forensics[spark]"')
    from forensics.case import is_uri
    from forensics.ingest import evidence_in_place, refused_in_place

    engine = case.engine
    in_place = evidence_in_place(con)
    if in_place and not engine.in_place:
        raise SparkError(refused_in_place(in_place))
    default = case.database.with_name(case.database.name + ".spark")
    staging_uri = engine.staging if engine.staging and is_uri(engine.staging) else None
    staging = Path(engine.staging) if engine.staging and not staging_uri else default
    if not staging.is_absolute():
        staging = case.folder / staging
    if progress:
        progress(f"Starting Spark ({engine.master})", 0, 0)
    from pyspark.sql import SparkSession

    # A session this process already runs (a notebook's, a test's) is used, and left running.
    ours = SparkSession.getActiveSession() is None
    session = start_session(engine.master, engine.conf)
    staged: list[Path] = []
    staged_urls: list[str] = []
    watch = StageWatch(session, progress) if progress else None
    read = None
    try:
        ws = SparkWorkspace(session)
        install_macros(ws)  # type: ignore[arg-type]
        if engine.in_place:
            from forensics.lake import read_in_place

            where = staging_uri or "file:" + str(staging.resolve())
            read = read_in_place(ws, con, case, where, step=watch.step if watch else None)
            staged_urls += read.staged
        else:
            if watch:
                watch.step("Copying the evidence tables to Spark", 0, 0)
            staged += ws.load_case_tables(con, staging)
        summary = detect_case(ws, case, progress=watch.step if watch else None)  # type: ignore[arg-type]
        for ddl in FINDINGS_DDL.values():
            con.execute(ddl)
        for table in SCOPE_DDL:
            con.execute(f"DROP TABLE IF EXISTS temp.{table}")
        ws.copy_findings(con, list(FINDINGS_DDL))
        if read is not None:
            from forensics.lake import copy_extract

            if watch:
                watch.step("Copying the evidence rows behind the findings", 0, 0)
            copy_extract(ws, con)
            summary.ingested = read.ingested
            for line in read.changed:
                summary.warnings.append(line)
                con.execute(
                    "INSERT INTO findings_warnings VALUES ('evidence_changed', $m)", {"m": line}
                )
        # The report says where detection ran (a DuckDB detection has no such row).
        con.execute(
            "INSERT INTO findings_case VALUES ('engine', $v)",
            {"v": json.dumps({"name": "spark", "master": engine.master}, sort_keys=True)},
        )
    finally:
        if watch:
            watch.stop()
        if staged_urls:
            from forensics.lake import remove

            for url in staged_urls:
                remove(session, url)
        if ours:
            session.stop()
        # The staged copy holds every customer's evidence: it does not outlive the run.
        for path in staged:
            path.unlink(missing_ok=True)
        if staging.is_dir() and not any(staging.iterdir()):
            staging.rmdir()
    return summary


class StageWatch:
    """Progress that also names the Spark stage running under the current step.

    Detection tells :meth:`step` what it starts, as it tells any progress callback; a Spark
    action then blocks that thread, so a second one looks at Spark's status tracker every
    ``every`` seconds and adds the active stage and its tasks to the line.
    """

    def __init__(self, session: SparkSession, progress: StepProgress, every: float = 0.5):
        import threading

        self._tracker = session.sparkContext.statusTracker()
        self._progress = progress
        self._lock = threading.Lock()
        self._what, self._done, self._total = "Spark", 0, 0
        self._stopped = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._watch, name="spark-stages", daemon=True)
        self._thread.start()

    def step(self, what: str, done: int, total: int) -> None:
        with self._lock:
            self._what, self._done, self._total = what, done, total
            self._progress(what, done, total)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        shown = None
        while not self._stopped.wait(self._every):
            try:
                infos = [self._tracker.getStageInfo(i) for i in self._tracker.getActiveStageIds()]
            except Exception:  # noqa: BLE001 - the session is stopping: nothing to show
                return
            stages = [s for s in infos if s is not None]
            if not stages:
                continue
            stage = max(stages, key=lambda s: s.stageId)
            line = (
                f"{self._what} (Spark stage {stage.stageId}: "
                f"{stage.numCompletedTasks}/{stage.numTasks} tasks)"
            )
            if line != shown:
                with self._lock:
                    self._progress(line, self._done, self._total)
                shown = line


def start_session(master: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A Spark session on ``master`` (``local[2]``, ``spark://host:7077``, ``yarn``...)."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        raise SparkError('the Spark engine needs pyspark: pip install "kv-forensics[spark]"')
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("kv-forensics")
    # Tasks run Python (the replay): by default this interpreter, whose packages they need
    # (local mode reads the variable; a cluster's executors take spark.pyspark.python).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Quiet by default: Spark's start-up chatter and PySpark's notice about the pandas version
    # (its tasks here use pandas for the replay's input only) would bury our own lines.
    log_config = Path(__file__).resolve().parent / "data" / "spark-log4j2.properties"
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        f"--driver-java-options -Dlog4j2.configurationFile=file:{log_config} pyspark-shell",
    )
    os.environ.setdefault(
        "PYTHONWARNINGS", "ignore:PySpark does not yet fully support pandas:FutureWarning"
    )
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas")
    for key, value in {**DEFAULT_CONF, **(conf or {}), **REQUIRED_CONF}.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except (PySparkException, RuntimeError, OSError) as exc:
        raise SparkError(
            f"Spark did not start on {master}: {_error_line(exc)} (it needs a Java 17+ "
            "runtime: JAVA_HOME, or java on the PATH)"
        ) from None
    session.sparkContext.setLogLevel("ERROR")
    # The replay's code travels with the job, so executors need numpy, pandas and pyarrow but
    # not this package installed.
    session.sparkContext.addPyFile(str(_package_zip()))
    # PySpark logs every failed statement's JVM stack trace itself; the error we raise says it.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    return session


@dataclass
class _Result:
    rows: list[tuple]
    names: list[str]
    position: int = 0


@dataclass
class SparkWorkspace:
    """A Spark session holding one case's tables, driven like a DuckDB connection."""

    session: SparkSession
    macros: dict[str, Macro] = field(default_factory=dict)
    tables: set[str] = field(default_factory=set)
    _result: _Result | None = None

    # --- the connection interface detection uses -------------------------------------------

    def execute(self, sql: str, values: dict[str, Any] | list | None = None) -> SparkWorkspace:
        """Run one statement (a text of several: each in turn); a query's rows wait for
        ``fetchone`` / ``fetchall``."""
        for statement in _split(sql):
            self._result = None
            df = self._run(statement, values)
            if df is not None:
                table = to_arrow(df, statement)
                self._result = _Result(_rows(table), list(table.column_names))
        return self

    def executemany(self, sql: str, rows: list[list[Any]]) -> SparkWorkspace:
        """Run a statement once per row of parameters. An ``INSERT ... VALUES`` of
        parameters takes all the rows in one statement (one Spark job, not one per row)."""
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(sql, read="duckdb")
        values = tree.expression if isinstance(tree, exp.Insert) else None
        if not rows or not isinstance(values, exp.Values) or len(values.expressions) != 1:
            for row in rows:
                self.execute(sql, list(row))
            return self
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            many = tree.copy()
            template = values.expressions[0]
            many.expression.set("expressions", [template.copy() for _ in chunk])
            self._insert(many, [value for row in chunk for value in row])
        return self

    def sql(self, sql: str, params: dict[str, Any] | None = None) -> _Relation:
        df = self._run(sql, params)
        if df is None:
            raise SparkError(f"not a query: {first_line(sql)}")
        return _Relation(df, sql)

    def fetchone(self) -> tuple | None:
        result = self._need_result()
        if result.position >= len(result.rows):
            return None
        result.position += 1
        return result.rows[result.position - 1]

    def fetchall(self) -> list[tuple]:
        result = self._need_result()
        rows, result.position = result.rows[result.position :], len(result.rows)
        return rows

    def fetchmany(self, size: int = 1) -> list[tuple]:
        result = self._need_result()
        rows = result.rows[result.position : result.position + size]
        result.position += len(rows)
        return rows

    @property
    def description(self) -> list[tuple]:
        return [(name,) for name in self._need_result().names]

    def replay_ranks(self, ranks: dict[tuple[str, int | None], dict[str, Any]]) -> dict:
        """The allocator replay of ``ranks``, one Spark task per rank (:func:`replay_ranks`)."""
        return replay_ranks(self, ranks)

    def extract_statements(self, sql: str) -> list:
        """The statements of a SQL text with the parameters each names (DuckDB's parser)."""
        import duckdb

        return duckdb.connect().extract_statements(sql)

    def register(self, name: str, table: pa.Table) -> None:
        """A Python Arrow table as a table of the workspace."""
        import pyarrow as pa

        # PySpark (4.3) keeps only the record batches before the first empty one: a table
        # concatenated from filtered pieces (the replay's exposures, rank by rank) lost all
        # but its first ranks' rows. Only the batches that hold rows are handed over.
        table = pa.Table.from_batches(
            [b for b in table.to_batches() if b.num_rows], schema=table.schema
        )
        self._replace(name, self.session.createDataFrame(table), materialise=False)

    def register_dataframe(self, name: str, df: DataFrame) -> None:
        """A Spark DataFrame as a table of the workspace (read as it is, not materialised)."""
        self._replace(name, df, materialise=False)

    def unregister(self, name: str) -> None:
        self.session.catalog.dropTempView(name)
        self.tables.discard(name)

    # --- loading and copying back -----------------------------------------------------------

    def load_case_tables(self, con: duckdb.DuckDBPyConnection, folder: Path) -> list[Path]:
        """Copy the evidence tables of a case database into Spark (through Parquet in
        ``folder``), each row with its DuckDB row id as ``__rowid``. Returns the files
        written (the caller removes them when Spark is done)."""
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SparkError(
                f"cannot create the staging folder {folder} ([engine].staging): {exc.strerror}"
            ) from None
        written = []
        for name in EVIDENCE_TABLES:
            path = folder / f"{name}.parquet"
            con.execute(
                f"COPY (SELECT rowid AS {ROWID}, * FROM {name} ORDER BY rowid) "  # noqa: S608
                f"TO '{path}' (FORMAT parquet)"
            )
            written.append(path)
            self._replace(name, self.session.read.parquet(str(path)), materialise=False)
        return written

    def copy_findings(self, con: duckdb.DuckDBPyConnection, names: list[str]) -> None:
        """Replace the case database's findings tables with the workspace's."""
        for name in names:
            con.execute(f"DELETE FROM {name}")  # noqa: S608 - fixed names
            # In pieces: 786,029 exposures at 16M requests, taken whole, were one task result
            # that a local driver's 1 GB heap lost.
            frame = self.session.table(name)
            for table in arrow_pieces(frame, f"copying {name} back", materialised=True):
                con.register("__spark_findings", table)
                columns = ", ".join(f'"{c}"' for c in table.column_names)
                con.execute(f"INSERT INTO {name} ({columns}) SELECT * FROM __spark_findings")  # noqa: S608
                con.unregister("__spark_findings")

    # --- statements -------------------------------------------------------------------------

    def _need_result(self) -> _Result:
        if self._result is None:
            raise SparkError("no query result to fetch")
        return self._result

    def _run(self, sql: str, values: dict[str, Any] | list | None) -> DataFrame | None:
        import sqlglot
        from sqlglot import exp

        try:
            tree = sqlglot.parse_one(sql, read="duckdb")
        except sqlglot.errors.ParseError as exc:
            raise UntranslatableSQL(f"{first_line(sql)}: {str(exc).splitlines()[0]}") from None
        if isinstance(tree, exp.Create) and tree.kind == "MACRO":
            self.macros.update(parse_macros(sql))
            return None
        if isinstance(tree, exp.Create):
            self._create(tree, values)
            return None
        if isinstance(tree, exp.Insert):
            self._insert(tree, values)
            return None
        if isinstance(tree, exp.Delete):
            self._delete(tree, values)
            return None
        if isinstance(tree, exp.Update):
            self._update(tree, values)
            return None
        if isinstance(tree, exp.Drop):
            for table in tree.args.get("tables") or [tree.this]:
                self.unregister(table.name)
            return None
        if isinstance(tree, exp.Query):
            return self._query(tree, values)
        raise UntranslatableSQL(f"statement kind {type(tree).__name__}: {first_line(sql)}")

    def _query(self, tree, values) -> DataFrame:
        from sqlglot import exp

        if isinstance(tree, exp.Union) and tree.args.get("by_name"):
            # DuckDB's UNION [ALL] BY NAME: Spark has it as a DataFrame method only.
            if tree.args.get("distinct"):
                raise UntranslatableSQL("UNION BY NAME without ALL")
            left, right = self._query(tree.left, values), self._query(tree.right, values)
            return left.unionByName(right, allowMissingColumns=True)
        text = spark_tree(tree, values, self.macros, self._schema).sql(dialect=_dialect())
        return self._spark_sql(text)

    @property
    def _schema(self) -> dict[str, dict[str, str]]:
        return {
            name: {f.name: f.dataType.simpleString() for f in self.session.table(name).schema}
            for name in self.tables
        }

    def _spark_sql(self, text: str) -> DataFrame:
        from pyspark.errors import PySparkException

        try:
            return self.session.sql(text)
        except PySparkException as exc:
            raise SparkError(f"{_error_line(exc)} (in: {first_line(text)})") from None

    def _create(self, tree, values) -> None:
        from sqlglot import exp

        name = tree.this.this.name if isinstance(tree.this, exp.Schema) else tree.this.name
        query = tree.expression
        if query is None:
            schema = ", ".join(
                f"`{c.name}` {_spark_type(c.args['kind'])}" for c in tree.this.expressions
            )
            self._replace(name, self.session.createDataFrame([], schema), materialise=False)
            return
        df = self._query(query, values)
        self._replace(name, df, materialise=tree.kind == "TABLE")

    def _insert(self, tree, values) -> None:
        from sqlglot import exp

        target = tree.this
        name = target.this.name if isinstance(target, exp.Schema) else target.name
        columns = [c.name for c in target.expressions] if isinstance(target, exp.Schema) else None
        old = self.session.table(name)
        source = tree.expression
        if isinstance(source, exp.Values):
            # Every row of the VALUES list: an inline table Spark types across all its rows.
            width = len(columns or old.columns)
            if any(len(row.expressions) != width for row in source.expressions):
                raise SparkError(f"INSERT INTO {name}: wrong number of values")
            inline = exp.Values(
                expressions=[row.copy() for row in source.expressions],
                alias=exp.TableAlias(
                    this=exp.to_identifier("__v"),
                    columns=[exp.to_identifier(f"__c{i}") for i in range(width)],
                ),
            )
            source = exp.select("*").from_(inline)
        new = self._query(source, values)
        names = columns or old.columns
        if len(new.columns) != len(names):
            raise SparkError(f"INSERT INTO {name}: {len(new.columns)} values for {len(names)}")
        new = new.toDF(*names)
        from pyspark.sql import functions as F

        new = new.select(
            *[
                (F.col(c) if c in names else F.lit(None)).cast(old.schema[c].dataType).alias(c)
                for c in old.columns
            ]
        )
        self._replace(name, old.unionByName(new), materialise=True)

    def _delete(self, tree, values) -> None:
        from sqlglot import exp

        name = tree.this.name
        where = tree.args.get("where")
        if where is None:
            self._replace(name, self.session.table(name).limit(0), materialise=True)
            return
        keep = (
            exp.select("*")
            .from_(tree.this.copy())
            .where(exp.not_(exp.func("coalesce", where.this.copy(), exp.false())))
        )
        self._replace(name, self._query(keep, values), materialise=True)

    def _update(self, tree, values) -> None:
        """``UPDATE t [AS a] SET c = m.x FROM (...) m WHERE a.k = m.k``: every row of t, the
        set columns taken from its match (at most one, as in DuckDB) where there is one."""
        from sqlglot import exp

        target = tree.this
        name, alias = target.name, target.alias_or_name
        source = tree.args.get("from_") or tree.args.get("from")
        where = tree.args.get("where")
        if source is None or where is None:
            raise UntranslatableSQL(f"UPDATE {name} without FROM ... WHERE")
        old = self.session.table(name)
        sets = {e.this.name: e.expression for e in tree.expressions}
        joined = source.this.copy()
        marked = exp.Subquery(
            this=exp.select("*", exp.true().as_("__matched")).from_(
                exp.Subquery(
                    this=joined.this if isinstance(joined, exp.Subquery) else joined, alias="__s"
                )
            ),
            alias=joined.alias_or_name,
        )
        matched = exp.column("__matched", table=joined.alias_or_name)
        columns = [
            exp.If(this=matched.copy(), true=sets[c].copy(), false=exp.column(c, table=alias)).as_(
                c
            )
            if c in sets
            else exp.column(c, table=alias).as_(c)
            for c in old.columns
        ]
        query = (
            exp.select(*columns)
            .from_(target.copy())
            .join(marked, on=where.this.copy(), join_type="left")
        )
        self._replace(name, self._query(query, values), materialise=True)

    def _replace(self, name: str, df: DataFrame, *, materialise: bool) -> None:
        if materialise:
            with one_line_failures(f"building {name}"):
                df = df.localCheckpoint(eager=True)
        df.createOrReplaceTempView(name)
        self.tables.add(name)


class _Relation:
    """What ``SparkWorkspace.sql`` returns: a query result to take as Arrow or rows."""

    def __init__(self, df: DataFrame, sql: str = ""):
        self._df, self._sql = df, sql

    @property
    def dataframe(self) -> DataFrame:
        return self._df

    def to_arrow_table(self) -> pa.Table:
        return to_arrow(self._df, self._sql)

    def fetchall(self) -> list[tuple]:
        return _rows(to_arrow(self._df, self._sql))


def _rows(table: pa.Table) -> list[tuple]:
    columns = [c.to_pylist() for c in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


def _split(sql: str) -> list[str]:
    import duckdb

    return [s.query for s in duckdb.connect().extract_statements(sql)]


def _spark_type(kind) -> str:
    from sqlglot import exp

    if kind.this == exp.DataType.Type.JSON:
        return "STRING"
    return kind.sql(dialect=_dialect())


def _dialect():
    from forensics.dialect import spark_dialect

    return spark_dialect()


# --- the allocator replay, one Spark task per decode rank -----------------------------------

_REPLAY_OUTPUT = (
    "part STRING, node STRING, dp_rank BIGINT, recipient_request_id STRING, "
    "recipient_tenant_id STRING, source_request_id STRING, source_tenant_id STRING, "
    "method STRING, tokens BIGINT, confidence STRING, source_released_at TIMESTAMP, "
    "drifted BOOLEAN, unknown_pages BIGINT, unsettled BOOLEAN, warning STRING"
)


def replay_ranks(
    ws: SparkWorkspace, ranks: dict[tuple[str, int | None], dict[str, Any]]
) -> dict[tuple[str, int | None], tuple[Any, dict, str | None]]:
    """Replay the decode ranks that hold an affected response, each as one Spark task
    (``cogroup(...).applyInPandas``) running the replay the single-machine path runs
    (:func:`forensics.attribution.rank_arrays`, :func:`forensics.replay.replay_rank`,
    :func:`forensics.attribution.rank_exposures`). ``ranks`` maps each rank to its victims.
    Returns per rank what ``attribution`` expects: its exposures (None when the rank has no
    timeline rows), each victim's status and the rank's drift warning."""
    import pyarrow as pa

    from forensics.attribution import (
        _TIMELINE_COLUMNS,
        MAYBE_COLUMN,
        MAYBE_JOIN,
        replay_events_sql,
    )

    if not ranks:
        return {}
    keys = list(ranks)
    ws.register(
        "replay_ranks",
        pa.table(
            {
                "node": pa.array([k[0] for k in keys], pa.string()),
                "dp_rank": pa.array([k[1] for k in keys], pa.int64()),
            }
        ),
    )
    # A row's place in its rank's allocation order, as the single-machine sort gives it.
    ws.execute(
        f"""CREATE OR REPLACE TEMP TABLE replay_timelines AS
            SELECT row_number() OVER (PARTITION BY s.node, s.dp_rank
                                      ORDER BY s.alloc_at, s.request_id) - 1 AS idx,
                   s.node, s.dp_rank, s.alloc_at, {_TIMELINE_COLUMNS}, {MAYBE_COLUMN}
            FROM decode_timeline s
            {MAYBE_JOIN}
            JOIN replay_ranks g ON g.node = s.node AND g.dp_rank IS NOT DISTINCT FROM s.dp_rank
            WHERE s.alloc_at IS NOT NULL"""
    )
    timelines = ws.session.table("replay_timelines")
    events = ws.sql(replay_events_sql(("node", "dp_rank"))).dataframe
    victims = {k: v for k, v in ranks.items()}
    replay = _rank_task(victims)
    found = (
        timelines.groupBy("node", "dp_rank")
        .cogroup(events.groupBy("node", "dp_rank"))
        .applyInPandas(replay, schema=_REPLAY_OUTPUT)
    )
    try:
        table = to_arrow(found, "the allocator replay")
    finally:
        ws.unregister("replay_ranks")
        ws.unregister("replay_timelines")
    return _replays_by_rank(table, ranks)


def _rank_task(victims: dict[tuple[str, int | None], dict[str, Any]]):
    """The function each rank's task runs: its timeline and events in, what it read out."""

    def replay(timeline, events):
        import pandas as pd
        import pyarrow as pa

        from forensics.attribution import rank_arrays, rank_exposures
        from forensics.replay import replay_rank

        if timeline.empty:
            return pd.DataFrame(columns=[c.split()[0] for c in _REPLAY_OUTPUT.split(", ")])
        node = timeline["node"].iloc[0]
        rank = timeline["dp_rank"].iloc[0]
        key = (node, None if pd.isna(rank) else int(rank))
        mine = victims[key]
        timeline = timeline.sort_values("idx", kind="stable")
        events = events.sort_values(
            ["us", "kind", "rid"], na_position="first", kind="stable"
        ).reset_index(drop=True)
        rows = pa.Table.from_pandas(timeline.reset_index(drop=True), preserve_index=False)
        arrays = rank_arrays(rows, pa.Table.from_pandas(events, preserve_index=False), mine)
        exposures, statuses, warning = rank_exposures(rows, mine, replay_rank(*arrays))
        out = exposures.to_pandas()
        out.insert(0, "part", "exposure")
        status = pd.DataFrame(
            {
                "part": "status",
                "recipient_request_id": list(statuses),
                "drifted": [s.drifted for s in statuses.values()],
                "unknown_pages": [s.unknown_pages for s in statuses.values()],
                "unsettled": [s.unsettled for s in statuses.values()],
            }
        )
        summary = pd.DataFrame({"part": ["rank"], "warning": [warning]})
        out = pd.concat([out.drop(columns=["rank"]), status, summary], ignore_index=True)
        out["node"], out["dp_rank"] = key[0], key[1]
        out = out[[c.split()[0] for c in _REPLAY_OUTPUT.split(", ")]]
        # Text as Python objects: PySpark's serializer takes no Arrow-backed string column.
        return out.astype({c: object for c in out.columns if pd.api.types.is_string_dtype(out[c])})

    return replay


def _replays_by_rank(table, ranks):
    """The replay tasks' rows, per rank as ``attribution`` takes them. Exposures stay in Arrow
    (there may be hundreds of thousands); statuses and summaries are a few rows per rank."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from forensics.attribution import VictimStatus, _exposure_schema

    schema = _exposure_schema()
    out: dict[tuple[str, int | None], tuple[Any, dict, str | None]] = dict.fromkeys(
        ranks, (None, {}, None)
    )
    is_exposure = pc.equal(table["part"], "exposure")
    exposures = table.filter(is_exposure)
    by_rank: dict[tuple[str, int | None], list[dict]] = {}
    for row in table.filter(pc.invert(is_exposure)).to_pylist():
        by_rank.setdefault((row["node"], row["dp_rank"]), []).append(row)
    for key, items in by_rank.items():
        if key not in out:
            continue
        node, rank = key
        same_rank = (
            pc.is_null(exposures["dp_rank"])
            if rank is None
            else pc.equal(exposures["dp_rank"], rank)
        )
        mine = exposures.filter(pc.and_(pc.equal(exposures["node"], node), same_rank))
        mine = mine.select([n for n in schema.names if n != "rank"]).append_column(
            "rank", pa.nulls(mine.num_rows, pa.int32())
        )
        statuses = {
            r["recipient_request_id"]: VictimStatus(
                r["drifted"], r["unknown_pages"], r["unsettled"]
            )
            for r in items
            if r["part"] == "status"
        }
        warning = next((r["warning"] for r in items if r["part"] == "rank"), None)
        out[key] = (mine.select(schema.names).cast(schema), statuses, warning)
    return out
