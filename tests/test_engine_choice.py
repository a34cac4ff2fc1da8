"""Choosing where detection runs: the manifest's [engine], the command-line options over it,
and each wrong value as one line naming it. (Spark itself: tests/test_spark.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from forensics.case import Engine, load_case
from forensics.cli import app
from forensics.errors import ManifestError

MINIMAL = """\
[incident]
id = "INC-1"

[[evidence]]
kind = "requests"
paths = ["evidence/requests-*.jsonl"]
"""


def _case(tmp_path: Path, engine: str) -> Path:
    path = tmp_path / "case.toml"
    path.write_text(MINIMAL + engine)
    return path


def test_duckdb_unless_the_manifest_says_otherwise(tmp_path):
    assert load_case(_case(tmp_path, "")).engine == Engine()
    case = load_case(
        _case(
            tmp_path,
            """
[engine]
name = "spark"
master = "spark://head:7077"
staging = "/mnt/shared/inc-1"

[engine.conf]
"spark.executor.memory" = "8g"
"spark.executor.instances" = 16
"spark.dynamicAllocation.enabled" = false
""",
        )
    )
    assert case.engine == Engine(
        name="spark",
        master="spark://head:7077",
        conf={
            "spark.executor.memory": "8g",
            "spark.executor.instances": "16",
            "spark.dynamicAllocation.enabled": "false",
        },
        staging="/mnt/shared/inc-1",
    )


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ('[engine]\nname = "flink"\n', "[engine].name: must be one of duckdb, spark, got 'flink'"),
        ("[engine]\nmaster = 7\n", "[engine].master: must be a string, got 7"),
        (
            "[engine]\nnodes = 4\n",
            "[engine].nodes: unknown key (expected one of: conf, evidence, master",
        ),
        (
            '[engine]\nevidence = "lake"\n',
            "[engine].evidence: must be one of database, in-place, got 'lake'",
        ),
        (
            '[engine]\nevidence = "in-place"\n',
            '[engine].evidence: in-place is read by Spark: it needs name = "spark"',
        ),
        (
            '[engine.conf]\n"executor.memory" = "8g"\n',
            "[engine].conf.executor.memory: is not a Spark setting (those start with spark.)",
        ),
        (
            '[engine.conf]\n"spark.jars" = ["a.jar"]\n',
            "[engine].conf.spark.jars: must be a string, number or boolean, got ['a.jar']",
        ),
    ],
)
def test_a_wrong_engine_setting_names_the_key(tmp_path, engine, message):
    with pytest.raises(ManifestError) as err:
        load_case(_case(tmp_path, engine))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--engine", "flink"], "Invalid value for '--engine': must be one of duckdb, spark"),
        (
            ["--engine", "spark", "--spark-conf", "executor.memory=8g"],
            "'executor.memory=8g': give a Spark setting as spark.key=value",
        ),
        (["--spark-conf", "spark.executor.memory"], "give a Spark setting as spark.key=value"),
    ],
)
def test_a_wrong_engine_option_is_a_usage_error(tiny_case_dir, options, message):
    result = CliRunner().invoke(app, ["detect", str(tiny_case_dir), *options])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_the_spark_engine_without_pyspark_says_what_to_install(tiny_case_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a)
    )
    assert CliRunner().invoke(app, ["ingest", str(tiny_case_dir)]).exit_code in (0, 1)
    result = CliRunner().invoke(app, ["detect", str(tiny_case_dir), "--engine", "spark"])
    assert result.exit_code == 1
    assert 'the Spark engine needs pyspark: pip install "kv-forensics[spark]"' in result.output


def test_the_command_line_engine_overrides_the_manifest(tmp_path):
    from forensics.app import with_engine

    case = load_case(_case(tmp_path, '[engine]\nname = "spark"\n[engine.conf]\n"spark.a" = 1\n'))
    chosen = with_engine(case, "duckdb", "local[2]", ["spark.b = x", "spark.a=2"])
    assert chosen.engine == Engine("duckdb", "local[2]", {"spark.a": "2", "spark.b": "x"})
    assert with_engine(case, None, None, None) is case


def test_a_staging_folder_that_cannot_be_made_is_one_line(tmp_path):
    """Before Spark reads anything: the folder, the key that names it, and why."""
    pytest.importorskip("pyspark", reason="the Spark engine needs pyspark")
    import duckdb

    from forensics.spark import SparkError, SparkWorkspace

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SparkError) as err:
        SparkWorkspace(session=None).load_case_tables(duckdb.connect(), blocker / "staging")
    assert str(err.value) == (
        f"cannot create the staging folder {blocker / 'staging'} ([engine].staging): "
        "Not a directory"
    )


# --- evidence read in place (forensics.lake) --------------------------------------------------


def test_in_place_evidence_is_read_from_the_manifest_and_keeps_uris(tmp_path):
    manifest = _case(tmp_path, '[engine]\nname = "spark"\nevidence = "in-place"\n')
    text = manifest.read_text().replace(
        "[[evidence]]",
        '[[evidence]]\nkind = "engine_legs"\npaths = ["s3a://logs/legs-*.parquet"]\n\n[[evidence]]',
        1,
    )
    manifest.write_text(text)
    case = load_case(manifest)
    assert case.engine.in_place and case.engine.evidence == "in-place"
    assert "s3a://logs/legs-*.parquet" in case.evidence[0].paths


def test_in_place_with_duckdb_is_a_usage_error(tiny_case_dir):
    result = CliRunner().invoke(app, ["detect", str(tiny_case_dir), "--in-place"])
    assert result.exit_code == 2
    assert "--in-place is read by Spark: add --engine spark" in " ".join(result.output.split())


def test_a_uri_pattern_is_not_loaded_into_the_case_database(tmp_path):
    manifest = _case(tmp_path, "")
    text = manifest.read_text().replace(
        "[[evidence]]",
        '[[evidence]]\nkind = "requests"\npaths = ["gs://logs/requests-*.jsonl.gz"]\n\n'
        "[[evidence]]",
        1,
    )
    manifest.write_text(text)
    result = CliRunner().invoke(app, ["ingest", str(manifest)])
    assert result.exit_code == 1
    assert (
        "Error: [[evidence]] #1: gs://logs/requests-*.jsonl.gz is a URI, which only Spark reads, "
        'where it lies: set [engine] name = "spark" and evidence = "in-place" (or pass --engine '
        "spark --in-place to run or detect)"
    ) in " ".join(result.output.split())


def test_ingest_of_a_case_read_in_place_says_where_it_is_read(tmp_path):
    manifest = _case(tmp_path, '[engine]\nname = "spark"\nevidence = "in-place"\n')
    result = CliRunner().invoke(app, ["ingest", str(manifest)])
    assert result.exit_code == 1
    assert (
        'Error: this case reads its evidence in place on Spark ([engine] evidence = "in-place"):'
        " forensics run or forensics detect read it where it lies; nothing is loaded here"
    ) in " ".join(result.output.split())


def test_a_case_read_in_place_is_not_detected_from_its_empty_database(tiny_case_dir):
    # Its requests lie elsewhere: detecting what the database holds would find it clean.
    from forensics.case import load_case
    from forensics.db import connect

    runner = CliRunner()
    assert runner.invoke(app, ["ingest", str(tiny_case_dir)]).exit_code in (0, 1)
    case = load_case(tiny_case_dir)
    con = connect(case.database)
    con.execute("DELETE FROM requests")
    con.execute("INSERT INTO evidence_in_place VALUES ('requests', 1200, now(), 'local[2]')")
    con.close()
    result = runner.invoke(app, ["detect", str(tiny_case_dir)])
    assert result.exit_code == 1
    assert (
        "Error: the evidence of this case was read in place by Spark (1,200 requests where they "
        "lie, none in the case database)"
    ) in " ".join(result.output.split())
    # Loading it here instead starts the database afresh from the manifest's files.
    assert runner.invoke(app, ["ingest", str(tiny_case_dir)]).exit_code in (0, 1)
    con = connect(case.database)
    assert con.execute("SELECT count(*) FROM evidence_in_place").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] > 0
    con.close()
