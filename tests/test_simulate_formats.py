"""One simulated case written canonical and in real formats: the same findings.

The simulator rewrites its evidence as an SGLang fleet's logs (with OTLP/JSON spans or a
LiteLLM spend log as the client record, or no client record at all); ingest reads them through
the adapters. What a responder acts on must not depend on the format the evidence came in.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from forensics.case import load_case
from forensics.cli import app
from forensics.db import connect
from forensics.detect import detect_case
from forensics.evaluate import evaluate
from forensics.ingest import ingest_case
from forensics.scope import scope_case
from forensics.simulate import simulate_case

SEED, REQUESTS = 5, 3000
AFFECTED = "SELECT request_id, tenant_id, verdict, excluded_by FROM findings_affected"
EXPOSURES = (
    "SELECT recipient_request_id, recipient_tenant_id, source_request_id, source_tenant_id, "
    "method, tokens, confidence FROM findings_exposures"
)
NOTIFIED = "SELECT * FROM findings_notifications"
WARNINGS = "SELECT code FROM findings_warnings"


def _findings(folder) -> dict:
    """Ingest, detect and scope a simulated case: what the tests compare across formats."""
    case = load_case(folder)
    result = ingest_case(case)
    con = connect(case.database)
    try:
        detect_case(con, case)
        scope_case(con, case)
        return {
            "result": result,
            "affected": set(con.execute(AFFECTED).fetchall()),
            "exposures": set(con.execute(EXPOSURES).fetchall()),
            "notified": set(con.execute(NOTIFIED).fetchall()),
            "evaluation": evaluate(con, folder / "truth"),
            "formats": {r[0] for r in con.execute("SELECT format FROM evidence").fetchall()},
            "warnings": {r[0] for r in con.execute(WARNINGS).fetchall()},
        }
    finally:
        con.close()


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    """Per format: the loaded ingest result, the findings and the evaluation against truth."""
    found = {}
    for fmt in ("canonical", "otel", "litellm", "sglang"):
        folder = tmp_path_factory.mktemp(fmt)
        simulate_case(folder, requests=REQUESTS, seed=SEED, fmt=fmt)
        found[fmt] = _findings(folder)
    return found


@pytest.mark.parametrize("fmt", ["otel", "litellm"])
def test_real_formats_give_the_canonical_findings(findings, fmt):
    canonical, real = findings["canonical"], findings[fmt]
    assert real["result"].ok and real["result"].rows_rejected == 0
    assert real["formats"] == {"sglang", fmt, "canonical"}  # tenant profiles stay canonical
    assert canonical["affected"], "the simulated case must have affected responses"
    assert real["affected"] == canonical["affected"]
    assert real["exposures"] == canonical["exposures"]
    assert real["notified"] == canonical["notified"]


def test_engine_logs_alone_find_every_affected_response_and_its_tenant(findings):
    engine = findings["sglang"]
    assert engine["result"].ok and engine["formats"] == {"sglang", "canonical"}
    ev = engine["evaluation"]
    assert ev.affected.true_positive > 0
    assert ev.affected.recall == 1.0 and ev.affected.precision == 1.0, ev.lines()
    # The tenant labels on the legs name every recipient: exclusions apply as with a client log.
    assert ev.exclusions_exact, ev.exclusion_mismatches
    canonical = {(r, t, v, x) for r, t, v, x in findings["canonical"]["affected"]}
    assert engine["affected"] == canonical


def test_decode_requests_that_waited_for_pages_replay_from_engine_logs_as_from_canonical(tmp_path):
    # One rank per decode node and a prober sweeping long prompts: many decode requests wait in
    # the preallocation queue, so they hold pages well after the engine received them.
    found, waited = {}, 0
    for fmt in ("canonical", "sglang"):
        folder = tmp_path / fmt
        simulate_case(
            folder, requests=6000, seed=5, fmt=fmt, probers="sweep", decode_dp_sizes=(1, 1, 1, 1)
        )
        truth = json.loads((folder / "truth" / "summary.json").read_text())
        waited = truth["decode_prealloc_waits"]
        found[fmt] = _findings(folder)
    assert waited >= 50
    canonical, engine = found["canonical"], found["sglang"]
    # The replay allocates each leg when the engine did (no pool overfilled) and sizes it with
    # the engine's count of generated tokens (no guesses): no rank is approximate.
    assert "replay_drift" not in engine["warnings"]
    assert engine["affected"] == canonical["affected"]
    pairs = engine["evaluation"].source_pairs
    assert pairs.precision >= 0.99 and pairs.recall >= 0.99, engine["evaluation"].lines()
    # The logs time an allocation to 10 microseconds: requests admitted from the queue in one
    # scheduler pass, microseconds apart, can swap, and then the pages after them.
    differ = canonical["exposures"] ^ engine["exposures"]
    assert len(differ) <= 0.01 * len(canonical["exposures"])
    # explain shows the engine's timing line that puts a decode leg's start after its wait.
    request_id = min(r for r, _, verdict, _ in engine["affected"] if verdict == "confirmed")
    assert CliRunner().invoke(app, ["detect", str(tmp_path / "sglang")]).exit_code == 0
    shown = CliRunner().invoke(app, ["explain", str(tmp_path / "sglang"), request_id])
    assert shown.exit_code == 0, shown.output
    assert "    stage timings: prealloc_queue_duration(" in shown.output


def test_a_real_format_case_is_the_same_bytes_for_the_same_seed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        simulate_case(folder, requests=400, seed=2, fmt="litellm")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
