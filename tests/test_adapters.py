"""The adapter framework: auto's choice, what an entry may say, tenant_field, the CLI flags."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.adapted import FORMATS
from typer.testing import CliRunner

from forensics.adapters import check_entry, sniff
from forensics.case import load_case
from forensics.cli import app
from forensics.db import connect
from forensics.errors import EvidenceError, ManifestError
from forensics.ingest import ingest_case, ingest_file

runner = CliRunner()


@pytest.mark.parametrize(
    ("name", "fmt", "why"),
    [
        ("prefill-0.log", "sglang", "SGLang output ('max_total_num_tokens=681280')"),
        ("decode-0_0.log", "sglang", 'SGLang output (\'"event": "request.received\')'),
        ("sglang-request-metrics-20260908_14.log", "sglang", "SGLang output"),
        ("server_info-decode-0.json", "sglang", "SGLang output ('\"model_path\"')"),
        ("server_info-unified.json", "sglang", "SGLang output ('\"model_path\"')"),
        ("traces.jsonl", "otel", "an OTLP/JSON trace export (resourceSpans)"),
        ("spend_logs.csv", "litellm", "a LiteLLM spend log export"),
        ("spend_logs.json", "litellm", "a LiteLLM spend log export"),
    ],
)
def test_auto_says_which_format_and_why(name, fmt, why):
    found, reason = sniff(FORMATS / name)
    assert found == fmt
    assert reason.startswith(why)


def test_auto_takes_canonical_records_and_parquet_and_refuses_the_unknown(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"request_id": "a"}\n')
    (tmp_path / "r.csv").write_text("request_id,tenant_id\na,t\n")
    # A canonical snapshot names the pool as a server-info document does; it is not one.
    (tmp_path / "p.jsonl").write_text(
        '{"node": "d-0", "observed_at": "2026-09-08T14:00:00Z", "max_total_num_tokens": 9}\n'
    )
    assert sniff(tmp_path / "p.jsonl")[0] == "canonical"
    pq.write_table(pa.table({"request_id": ["a"]}), tmp_path / "r.parquet")
    (tmp_path / "notes.txt").write_text("hello\nworld\n")
    assert sniff(tmp_path / "r.jsonl") == ("canonical", "JSON or CSV records of no other format")
    assert sniff(tmp_path / "r.csv")[0] == "canonical"
    assert sniff(tmp_path / "r.parquet") == ("canonical", "a Parquet file")
    with pytest.raises(EvidenceError, match="cannot tell the format from the first lines"):
        sniff(tmp_path / "notes.txt")
    with pytest.raises(EvidenceError, match="file not found"):
        sniff(tmp_path / "absent.log")


def test_what_an_entry_may_combine():
    assert check_entry("sglang", "engine_legs", "tier") is None
    assert check_entry("canonical", "requests", "customer") is None
    assert check_entry("auto", "tenants", None) is None
    assert check_entry("sglang", "requests", None) == (
        "format 'sglang' maps onto engine_legs, pool_snapshots, not requests"
    )
    assert check_entry("sglang", "pool_snapshots", "x") == (
        "tenant_field applies to engine_legs only with format sglang"
    )
    assert check_entry("canonical", "engine_legs", "x") == (
        "tenant_field applies to requests only with format canonical"
    )


MANIFEST = """[incident]
id = "INC-F"

[[evidence]]
kind = "{kind}"
format = "{fmt}"
paths = ["x.log"]
{more}
"""


@pytest.mark.parametrize(
    ("kind", "fmt", "more", "message"),
    [
        (
            "pool_snapshots",
            "sglang",
            'tenant_field = "tenant"',
            "[[evidence]] #1.tenant_field: tenant_field applies to engine_legs only",
        ),
        (
            "engine_legs",
            "otel",
            "",
            "[[evidence]] #1.format: format 'otel' maps onto requests, not engine_legs",
        ),
    ],
)
def test_the_manifest_refuses_what_it_would_ignore(tmp_path, kind, fmt, more, message):
    path = tmp_path / "case.toml"
    path.write_text(MANIFEST.format(kind=kind, fmt=fmt, more=more))
    with pytest.raises(ManifestError) as info:
        load_case(path)
    assert message in str(info.value)


def test_canonical_tenant_field_names_the_tenant_column(tmp_path):
    row = {
        "request_id": "a",
        "customer": "acct_5",
        "received_at": "2026-09-08T14:00:00Z",
        "prompt_tokens": 3,
        "http_status": 200,
    }
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n")
    con = connect(":memory:")
    ingest_file(con, path, "requests", tenant_field="customer")
    assert con.execute("SELECT request_id, tenant_id FROM requests").fetchall() == [("a", "acct_5")]
    with pytest.raises(EvidenceError, match="no column 'team' \\(the entry's tenant_field\\)"):
        ingest_file(connect(":memory:"), path, "requests", tenant_field="team")


def test_a_case_entry_gives_node_role_and_tenant_field(tmp_path):
    shutil.copy(FORMATS / "sglang-request-metrics-20260908_14.log", tmp_path)
    (tmp_path / "case.toml").write_text(
        '[incident]\nid = "INC-F"\n\n[[evidence]]\nkind = "engine_legs"\nformat = "auto"\n'
        'paths = ["sglang-request-metrics-*.log"]\nnode = "decode-7"\nrole = "decode"\n'
        'tenant_field = "tenant_id"\n'
    )
    case = load_case(tmp_path)
    result = ingest_case(case)
    assert [(f.format, f.rows_loaded) for f in result.files] == [("sglang", 2)]
    con = connect(case.database)
    assert con.execute(
        "SELECT request_id, node, role, extra->>'$.tenant_id' FROM engine_legs ORDER BY 1"
    ).fetchall() == [("r5", "decode-7", "decode", "acct_3"), ("r6", "decode-7", "decode", None)]
    assert con.execute("SELECT format FROM evidence").fetchall() == [("sglang",)]
    con.close()


def test_cli_auto_shows_the_format_it_chose(tmp_path):
    db = tmp_path / "c.duckdb"
    args = ["ingest", str(db), str(FORMATS / "decode-0_0.log"), "--kind", "engine_legs"]
    result = runner.invoke(app, [*args, "--format", "auto", "--role", "decode"])
    assert result.exit_code == 0, result.output
    assert "format sglang, read 4, loaded 2, rejected 2" in result.output


def test_cli_node_flag_and_its_usage_errors(tmp_path):
    db = tmp_path / "c.duckdb"
    path = str(FORMATS / "sglang-request-metrics-20260908_14.log")
    args = ["ingest", str(db), path, "--kind", "engine_legs", "--format", "sglang"]
    result = runner.invoke(app, [*args, "--node", "decode-3", "--role", "decode"])
    assert result.exit_code == 0, result.output
    con = connect(db)
    assert con.execute("SELECT DISTINCT node FROM engine_legs").fetchall() == [("decode-3",)]
    con.close()
    result = runner.invoke(app, ["ingest", str(tmp_path), "--node", "x"])
    assert result.exit_code == 2
    assert "--node, --role and --tenant-field come from its [[evidence]]" in result.output
    bad = runner.invoke(app, [*args, "--tenant-field", "t", "--kind", "pool_snapshots"])
    assert bad.exit_code == 1
    assert "tenant_field applies to engine_legs only with format sglang" in bad.output
