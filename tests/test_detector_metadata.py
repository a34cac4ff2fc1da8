"""Detector metadata is validated against its declared schema, and each detector's verdict
rules come from its own metadata: adding a detector is adding two files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from forensics.db import connect, insert_rows
from forensics.detect import assign_verdicts, prepare, run_detectors
from forensics.detectors import load_detectors
from forensics.errors import ForensicsError
from forensics.paths import queries_dir
from forensics.schema import FINDINGS_DDL


def copy_queries(tmp_path: Path, only: tuple[str, ...] = ("over_pool",)) -> Path:
    folder = tmp_path / "queries"
    folder.mkdir()
    for name in only:
        for suffix in (".sql", ".yml"):
            shutil.copy(queries_dir() / f"{name}{suffix}", folder / f"{name}{suffix}")
    return folder


def rewrite(path: Path, change) -> None:
    meta = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(meta)
    path.write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")


def test_the_shipped_metadata_loads(tmp_path):
    assert {d.id for d in load_detectors(copy_queries(tmp_path))} == {"over_pool"}


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda m: m.pop("title"), "over_pool.yml: missing key 'title'"),
        (lambda m: m.pop("verdict"), "over_pool.yml: missing key 'verdict'"),
        (
            lambda m: m.update(severty="high"),
            "over_pool.yml: unknown key 'severty' (expected one of:",
        ),
        (
            lambda m: m["parameters"]["context_length"].update(defualt=3),
            "over_pool.yml: parameters.context_length: unknown key 'defualt'",
        ),
        (
            lambda m: m["parameters"]["context_length"].pop("default"),
            "over_pool.yml: parameters.context_length: missing key 'default'",
        ),
        (
            lambda m: m["verdict"].update(base="certain"),
            "over_pool.yml: verdict.base must be one of confirmed, likely, possible",
        ),
        (
            lambda m: m["verdict"].update(if_short_prompt="likely"),
            "over_pool.yml: verdict: unknown key 'if_short_prompt'",
        ),
        (lambda m: m.update(severity="urgent"), "over_pool.yml: severity must be one of"),
        (lambda m: m.update(stage="two"), "over_pool.yml: 'stage' must be a int, got 'two'"),
        (
            lambda m: m.update(description="Over {pool_limit} tokens"),
            "over_pool.yml: description names 'pool_limit' that is not a declared parameter",
        ),
        (
            lambda m: m["tests"][0].update(expects=[]),
            "over_pool.yml: tests[0]: unknown key 'expects'",
        ),
        (lambda m: m.update(id="overpool"), "over_pool.yml: id 'overpool' is not the file name"),
    ],
)
def test_bad_metadata_is_refused_with_the_file_and_the_key(tmp_path, change, message):
    folder = copy_queries(tmp_path)
    rewrite(folder / "over_pool.yml", change)
    with pytest.raises(ForensicsError) as err:
        load_detectors(folder)
    assert str(err.value).startswith(message)


def test_invalid_yaml_is_one_line(tmp_path):
    folder = copy_queries(tmp_path)
    (folder / "over_pool.yml").write_text("id: [over_pool\n", encoding="utf-8")
    with pytest.raises(ForensicsError, match=r"^over_pool.yml: not valid YAML \("):
        load_detectors(folder)


def test_a_detector_without_metadata_is_refused(tmp_path):
    folder = copy_queries(tmp_path)
    (folder / "over_pool.yml").unlink()
    with pytest.raises(ForensicsError, match="over_pool.sql: detector has no metadata file"):
        load_detectors(folder)


NEW_SQL = """SELECT request_id, prompt_tokens::DOUBLE AS value, $min_tokens::DOUBLE AS threshold,
       'long and answered' AS detail,
       to_json([{'table': 'requests', 'evidence_id': evidence_id, 'source_row': source_row}])
         AS evidence
FROM scoped_requests WHERE http_status = 200 AND prompt_tokens >= $min_tokens
ORDER BY request_id
"""


def new_detector(folder: Path, verdict: dict) -> None:
    (folder / "very_long.sql").write_text(NEW_SQL, encoding="utf-8")
    meta = {
        "id": "very_long",
        "title": "Very long prompt answered",
        "severity": "low",
        "signal": "very_long",
        "description": "A prompt of at least {min_tokens} tokens answered with 200.",
        "parameters": {"min_tokens": {"default": 1000, "description": "length"}},
        "verdict": verdict,
        "output_columns": ["request_id", "value", "threshold", "detail", "evidence"],
        "tests": [{"name": "t", "expect": []}],
    }
    (folder / "very_long.yml").write_text(yaml.safe_dump(meta), encoding="utf-8")


@pytest.mark.parametrize(
    "verdict,expected",
    [
        ({"base": "possible"}, {"r-long": "possible", "r-huge": "possible"}),
        (
            {"base": "possible", "if_long_prompt": "likely"},
            {"r-long": "possible", "r-huge": "likely"},
        ),
        ({"base": "confirmed"}, {"r-long": "confirmed", "r-huge": "confirmed"}),
    ],
)
def test_a_new_detector_weighs_in_the_verdict_by_its_metadata_alone(tmp_path, verdict, expected):
    folder = tmp_path / "queries"
    folder.mkdir()
    new_detector(folder, verdict)
    con = connect(":memory:")
    for ddl in FINDINGS_DDL.values():
        con.execute(ddl)
    insert_rows(
        con,
        "requests",
        [
            {
                "request_id": rid,
                "tenant_id": "t1",
                "received_at": "2026-08-28T10:00:00Z",
                "prompt_tokens": tokens,
                "http_status": 200,
            }
            for rid, tokens in (("r-short", 10), ("r-long", 2000), ("r-huge", 90000))
        ],
    )
    params = {"context_length": None, "long_prompt_tokens": 65536, "max_held_ratio": 0.5}
    prepare(con, params)
    detectors = load_detectors(folder)
    assert run_detectors(con, params, detectors) == {"very_long": 2}
    assign_verdicts(con, params, detectors)
    got = dict(con.execute("SELECT request_id, verdict FROM findings_affected").fetchall())
    assert got == expected
