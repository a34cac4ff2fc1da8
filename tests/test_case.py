"""The case manifest: loading, path resolution and one-line errors that name the key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from forensics.case import load_case, parse_instant
from forensics.errors import ManifestError

MINIMAL = """\
[incident]
id = "INC-1"
timezone = "UTC"

[[evidence]]
kind = "requests"
paths = ["evidence/requests-*.jsonl"]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "case.toml"
    path.write_text(text)
    return path


def test_minimal_manifest_resolves_paths_against_its_folder(tmp_path):
    (tmp_path / "evidence").mkdir()
    for name in ("requests-02.jsonl", "requests-01.jsonl", "other.jsonl"):
        (tmp_path / "evidence" / name).write_text("")
    case = load_case(_write(tmp_path, MINIMAL))
    assert case.id == "INC-1" and case.database == tmp_path.resolve() / "case.duckdb"
    assert [p.name for p in case.evidence[0].files()] == ["requests-01.jsonl", "requests-02.jsonl"]
    assert case.detection.overlap_window == timedelta(minutes=15)


def test_tiny_case_loads(tiny_case_dir):
    case = load_case(tiny_case_dir / "case.toml")
    assert [e.kind for e in case.evidence] == [
        "requests",
        "engine_legs",
        "pool_snapshots",
        "tenants",
    ]
    assert case.exclusions[0].tenant_ids == ("acct_researcher",)
    assert case.context_length == 1048576


def test_naive_instants_use_the_manifest_timezone(tmp_path):
    text = MINIMAL.replace(
        'timezone = "UTC"', 'timezone = "Europe/Rome"\nstart = "2026-09-08 16:00:00"'
    )
    case = load_case(_write(tmp_path, text))
    assert case.start == datetime(2026, 9, 8, 14, tzinfo=UTC)
    assert parse_instant("2026-09-08T14:00:00Z") == case.start


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("[incident]\n", '[incident]\ncolour = "red"\n'),
            "case.toml: [incident].colour: unknown key (expected one of: ",
        ),
        (
            ('id = "INC-1"', 'id = "INC-1"\ncontext_length = "big"'),
            "case.toml: [incident].context_length: must be an integer, got 'big'",
        ),
        (
            ("", "[detection]\nlatency_factor = 1.5\n"),
            "case.toml: [detection].latency_factor: must be a number between 0 and 1, got 1.5",
        ),
        (
            ("", '[detection]\nlatency_factor = "fast"\n'),
            "case.toml: [detection].latency_factor: must be a number, got 'fast'",
        ),
        (
            ("", '[detection]\noverlap_window = "15 minutes"\n'),
            "case.toml: [detection].overlap_window: not a duration like '15m' or '90s': "
            "'15 minutes'",
        ),
        (
            ('timezone = "UTC"', 'timezone = "Mars/Olympus"'),
            "case.toml: [incident].timezone: unknown time zone 'Mars/Olympus'",
        ),
        (
            ("", '[[exclusion]]\nname = "lab"\nclient_cidrs = ["10.0.0.0/33"]\n'),
            "case.toml: [[exclusion]] 'lab'.client_cidrs: not a CIDR: '10.0.0.0/33'",
        ),
        (
            ("", '[[exclusion]]\nname = "window"\nstart = "2026-09-08T00:00:00Z"\n'),
            "case.toml: [[exclusion]] 'window'.tenant_ids: an exclusion needs tenant_ids, "
            "api_key_ids, client_cidrs or user_agent_regex",
        ),
        (
            ('id = "INC-1"\n', ""),
            "case.toml: [incident].id: is required",
        ),
        (
            ('kind = "requests"', 'kind = "request"'),
            "case.toml: [[evidence]] #1.kind: must be one of requests, engine_legs",
        ),
    ],
    ids=[
        "unknown-key",
        "bad-type",
        "latency-range",
        "latency-type",
        "duration",
        "timezone",
        "cidr",
        "no-selector",
        "missing-id",
        "bad-kind",
    ],
)
def test_manifest_errors_name_the_key(tmp_path, change, message):
    old, new = change
    text = MINIMAL.replace(old, new, 1) if old else MINIMAL + new
    with pytest.raises(ManifestError) as info:
        load_case(_write(tmp_path, text))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_missing_and_invalid_manifest_files(tmp_path):
    with pytest.raises(ManifestError, match="case manifest not found"):
        load_case(tmp_path / "nope.toml")
    with pytest.raises(ManifestError, match=r"case\.toml: not valid TOML"):
        load_case(_write(tmp_path, "[incident\nid="))
