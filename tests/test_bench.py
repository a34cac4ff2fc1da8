"""The scale benchmark harness (benchmarks/run.py) keeps working: its small mode runs end to end.

Nothing here judges a time: times vary from run to run, and the small mode exists so the harness
cannot rot between the runs that measure.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_docstring_examples():
    result = doctest.testmod(_load("run"))
    assert result.failed == 0 and result.attempted >= 2


def test_measure_names_how_a_stage_ended():
    run = _load("run")
    failed = run.measure([sys.executable, "-c", "print('no such case'); raise SystemExit(3)"], 60)
    assert failed["outcome"] == "failed (exit 3)"
    assert failed["last_line"] == "no such case"
    slow = run.measure([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert slow["outcome"] == "timeout after 0 s" and slow["seconds"] < 20
    fine = run.measure([sys.executable, "-c", "print('done')"], 60)
    assert fine["outcome"] == "ok" and fine["exit"] == 0 and fine["peak_rss_mb"] > 0


def test_growth_per_doubling():
    run = _load("run")
    rows = [
        {"requests": n, "format": "parquet", "stages": {"run": {"outcome": "ok", "seconds": s}}}
        for n, s in ((1_000_000, 10.0), (2_000_000, 21.0), (8_000_000, 84.0))
    ]
    run.growth(rows)
    assert rows[0]["growth_per_doubling"] == {}
    assert rows[1]["growth_per_doubling"] == {"run": 2.1}
    assert rows[2]["growth_per_doubling"] == {"run": 2.0}  # 4x over two doublings


@pytest.mark.slow
def test_small_mode_runs_every_stage(tmp_path):
    out = tmp_path / "small.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--small", "--cache", str(tmp_path / "cache")]
        + ["--out", str(out), "--timeout", "900"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run/floor" in proc.stdout and "growth/doubling" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "small" and doc["machine"]["cpus"] >= 1
    by_format = {row["format"]: row for row in doc["rows"]}
    assert set(by_format) == {"parquet", "jsonl"}
    parquet = by_format["parquet"]
    # Detection on Spark too, where pyspark and a Java runtime are installed (CI has both).
    spark = set() if _load("run").spark_missing() else {"spark"}
    stages = {"floor", "peer", "ingest", "detect", "report", "weak_detect", "weak_report", "run"}
    stages |= spark
    assert set(parquet["stages"]) == stages
    assert set(by_format["jsonl"]["stages"]) == {"floor", "ingest"}
    for row in doc["rows"]:
        for name, stage in row["stages"].items():
            assert stage["outcome"] == "ok", (row["format"], name, stage)
            assert stage["seconds"] > 0 and stage["peak_rss_mb"] > 0
    # Every stage saw the same case: the floor loaded every row, forensics found every
    # affected response the generator planted, and the peer flagged as many over the pool.
    assert sum(parquet["floor_result"]["rows"].values()) == parquet["input_rows"]
    assert parquet["found"]["affected"] == parquet["planted_affected"] > 0
    assert parquet["peer_result"]["flagged"] == parquet["planted_affected"]
    if spark:
        assert parquet["found_spark"] == parquet["found"]
    # The weak signal fired on many requests (as possible) and took nothing from the planted.
    weak = parquet["found_weak"]
    assert weak["possible"] > parquet["requests"] / 50 > parquet["found"]["possible"]
    assert weak["affected"] == parquet["found"]["affected"]
    assert "weak signal:" in proc.stdout
    # The case stays cached for the next run; the databases and reports are gone.
    (case,) = (tmp_path / "cache").iterdir()
    assert (case / "meta.json").exists() and not list(case.rglob("*.duckdb"))


def test_a_day_past_the_part_size_is_generated_in_parts(tmp_path, monkeypatch):
    casegen = _load("casegen")
    monkeypatch.setattr(casegen, "PART_REQUESTS", 3_000)
    shape = casegen.SHAPES["small"]
    meta = casegen.generate(tmp_path / "case", 14 * 7_000, shape=shape, formats=("parquet",))
    evidence = tmp_path / "case" / "parquet" / "evidence"
    assert not (tmp_path / "case" / "jsonl").exists()
    # 7,000 requests a day in parts of at most 3,000: three files a day for each table.
    first_day = sorted(p.name for p in evidence.glob("requests-2026-08-27*"))
    assert first_day == [f"requests-2026-08-27-p{k}.parquet" for k in (1, 2, 3)]
    import pyarrow.parquet as pq

    rows = sum(pq.read_metadata(p).num_rows for p in evidence.glob("requests-*"))
    assert rows == meta["requests"] == 14 * 7_000
    assert meta["bytes"].keys() == {"parquet"}


def test_a_cached_case_missing_a_format_gets_it_added(tmp_path):
    """A case cached in one format (casegen.py --formats) is not taken for one with both: the
    missing format is generated beside it and moved in, the same case by its counts."""
    casegen, run = _load("casegen"), _load("run")
    requests, seed = 14 * 2_000, 3
    folder = tmp_path / f"v{casegen.GENERATOR_VERSION}-seed{seed}-{requests}-small"
    meta = casegen.generate(folder, requests, seed, casegen.SHAPES["small"], ("parquet",))
    parquet = sorted(p.name for p in (folder / "parquet" / "evidence").iterdir())
    got = run.ensure_case(tmp_path, requests, seed, True, 600, ("parquet", "jsonl"))
    assert got == folder and sorted(p.name for p in tmp_path.iterdir()) == [folder.name]
    after = json.loads((folder / "meta.json").read_text())
    assert after["bytes"].keys() == {"parquet", "jsonl"}
    assert after["bytes"]["parquet"] == meta["bytes"]["parquet"]
    assert after["requests"] == meta["requests"] == requests
    assert sorted(p.name for p in (folder / "parquet" / "evidence").iterdir()) == parquet
    assert (folder / "jsonl" / "case.toml").exists()
    assert any((folder / "jsonl" / "evidence").glob("requests-*.jsonl.gz"))


def test_statement_profile_runs_under_the_manifests_memory_limit(
    tiny_case_dir, monkeypatch, capsys
):
    # A profile of detection under another limit than the one `forensics detect` would use
    # measures something no responder runs.
    import forensics.detect
    from forensics.case import load_case
    from forensics.ingest import ingest_case

    manifest = tiny_case_dir / "case.toml"
    text = manifest.read_text()
    manifest.write_text(
        text.replace('path = "case.duckdb"', 'path = "case.duckdb"\nmemory_limit = "300MB"')
    )
    ingest_case(load_case(manifest))
    seen = []

    def detect_case(con, case):
        seen.append(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])

    monkeypatch.setattr(forensics.detect, "detect_case", detect_case)
    _load("profile").statements(manifest, top=5)
    assert seen == ["286.1 MiB"]  # 300 MB as DuckDB states it (the default would be 1.8 GiB)
    assert "detect:" in capsys.readouterr().out


def test_no_decode_rank_holds_more_than_its_pool(tmp_path):
    # One decode rank and a third of the prompts long: without the pre-allocation queue, long
    # prompts overlap past the pool every day; an engine would make them wait.
    import duckdb

    casegen = _load("casegen")
    shape = casegen.Shape(prefill_nodes=2, decode_nodes=1, dp_size=1, tenants=50, long_share=0.3)
    casegen.generate(tmp_path / "case", 14 * 2_000, shape=shape, formats=("parquet",))
    legs = tmp_path / "case" / "parquet" / "evidence"
    held, waited = duckdb.sql(
        f"""WITH d AS (
              SELECT l.started_at, l.finished_at, r.received_at,
                     ceil((l.reserved_tokens + r.completion_tokens + 1) / 64) * 64 AS tokens
              FROM '{legs}/engine_legs-decode-*.parquet' l
              JOIN '{legs}/requests-*.parquet' r USING (request_id)),
            e AS (SELECT started_at AS t, tokens AS d FROM d
                  UNION ALL SELECT finished_at, -tokens FROM d)
            SELECT (SELECT max(h) FROM (SELECT sum(d) OVER (ORDER BY t, d) AS h FROM e)),
                   (SELECT count(*) FROM d WHERE started_at - received_at > INTERVAL 10 SECOND)"""
    ).fetchall()[0]
    assert held <= casegen.DECODE_POOL
    assert waited > 0  # some requests queued for room
