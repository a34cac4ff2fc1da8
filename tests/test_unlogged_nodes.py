"""A node that served traffic but whose log was not loaded: the check that names it.

Coverage counts the requests that lack a leg, but a count does not tell a responder which file
to fetch; with engine logs alone, the responses a missing decode node served over stale pages
stay unresolved leads, not notices. The check must name the node, and stay silent when every
node that served traffic has its log, or a node reported its pool and served nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from forensics.case import load_case
from forensics.db import connect
from forensics.detect import ALERTS, detect_case
from forensics.ingest import ingest_case
from forensics.simulate import simulate_case


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unlogged")
    cases = {}
    for fmt in ("canonical", "sglang"):
        cases[fmt] = root / fmt
        simulate_case(cases[fmt], requests=2_000, seed=23, fmt=fmt)
    return cases


def _copy(source: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "case"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("case.duckdb*"))
    return folder


def _drop_legs(folder: Path, role: str, node: str) -> None:
    """Rewrite the canonical legs file of ``role`` without ``node``'s rows."""
    path = folder / "evidence" / f"engine_legs-{role}.parquet"
    out = path.with_suffix(".tmp")
    duckdb.execute(
        f"COPY (SELECT * FROM read_parquet('{path}') WHERE node <> '{node}') TO '{out}'"
        " (FORMAT parquet)"
    )
    out.replace(path)


def _detect(folder: Path, before=None) -> tuple[list[tuple[str, str]], duckdb.DuckDBPyConnection]:
    case = load_case(folder / "case.toml")
    ingest_case(case)
    con = connect(case.database)
    if before:
        before(con)
    summary = detect_case(con, case)
    return list(zip(summary.warning_codes, summary.warnings, strict=True)), con


def _unlogged(warnings: list[tuple[str, str]]) -> list[str]:
    return [m for c, m in warnings if c == "node_unlogged"]


def _lacking(con, side: str, signal: str) -> tuple[int, int]:
    """Engine requests with no ``side`` leg anywhere, and requests that fired ``signal``."""
    [(lacking,)] = con.execute(
        "SELECT rows FROM findings_coverage WHERE scope = $scope AND node IS NULL",
        {"scope": f"leg_missing:{side}"},
    ).fetchall()
    [(fired,)] = con.execute(
        "SELECT count(*) FROM findings_signals WHERE signal = $signal", {"signal": signal}
    ).fetchall()
    return lacking, fired


def test_a_missing_decode_log_is_named_when_engine_logs_are_all_there_is(simulated, tmp_path):
    folder = _copy(simulated["sglang"], tmp_path)
    (folder / "evidence" / "sglang" / "decode-1.log.gz").unlink()
    warnings, con = _detect(folder)
    [message] = _unlogged(warnings)
    lacking, unresolved = _lacking(con, "decode", "rejection_unresolved")
    assert lacking > 0 and unresolved > 0
    assert message.startswith(
        f"No decode log was loaded for decode-1, though it reported a KV pool while {lacking:,}"
        " engine requests whose prefill completed have no decode leg anywhere: "
    )
    assert (
        f"; {unresolved:,} prefill rejections of requests with no other record stay unresolved"
        " (possible, not notified) and may have been answered there. Load its log and detect"
        " again." in message
    )
    # An alert: it comes before the warnings that only qualify a figure.
    assert "node_unlogged" in ALERTS
    assert warnings[0][0] == "node_unlogged"


def test_a_missing_decode_log_is_named_with_what_the_client_log_routed_there(simulated, tmp_path):
    folder = _copy(simulated["canonical"], tmp_path)
    _drop_legs(folder, "decode", "decode-2")
    warnings, con = _detect(folder)
    [message] = _unlogged(warnings)
    [(routed,)] = con.execute(
        "SELECT count(*) FROM coverage_missing_legs WHERE role = 'decode' AND node = 'decode-2'"
    ).fetchall()
    assert routed > 0
    assert message.startswith(
        "No decode log was loaded for decode-2, though the client log routed at least"
        f" {routed:,} successful requests there: the responses decoded there are judged from"
        " the other logs alone, their sources attributed from client times where a client"
        " record exists and not at all where none does. Load its log and detect again, or, if"
        " it was loaded, give the client records the node names the engine logs use."
    )


def test_a_missing_prefill_log_is_named_too(simulated, tmp_path):
    folder = _copy(simulated["canonical"], tmp_path)
    _drop_legs(folder, "prefill", "prefill-0")
    warnings, _ = _detect(folder)
    [message] = _unlogged(warnings)
    assert message.startswith("No prefill log was loaded for prefill-0, though the client log")
    assert "a rejection logged there, or a prompt cut short on its way to decode" in message


def test_a_missing_prefill_log_is_named_when_engine_logs_are_all_there_is(simulated, tmp_path):
    # A decode leg is the second half of a PD request: with no prefill leg anywhere, a prefill
    # log is missing, and the node whose limit the prompt met is unknown.
    folder = _copy(simulated["sglang"], tmp_path)
    (folder / "evidence" / "sglang" / "prefill-1.log.gz").unlink()
    warnings, con = _detect(folder)
    [message] = _unlogged(warnings)
    lacking, unplaced = _lacking(con, "prefill", "over_pool_unplaced")
    assert lacking > 0
    assert message.startswith(
        f"No prefill log was loaded for prefill-1, though it reported a KV pool while {lacking:,}"
        " engine requests with a decode leg have no prefill leg anywhere: the prompts prefilled"
        " there are judged from the other logs alone"
    )
    said = "stay possible (over_pool_unplaced), not notified" in message
    assert said == (unplaced > 0)


def test_no_warning_when_every_node_that_served_traffic_has_its_log(simulated, tmp_path):
    folder = _copy(simulated["canonical"], tmp_path)

    # A spare decode node that reported its pool and served nothing: not a gap.
    def spare(con):
        con.execute(
            "INSERT INTO pool_snapshots (node, observed_at, max_total_num_tokens, role,"
            " evidence_id, source_row) SELECT 'decode-spare', min(observed_at),"
            " max(max_total_num_tokens), 'decode', min(evidence_id), 0 FROM pool_snapshots"
        )

    warnings, _ = _detect(folder, before=spare)
    assert _unlogged(warnings) == []
    sglang, _ = _detect(_copy(simulated["sglang"], tmp_path / "sglang"))
    assert _unlogged(sglang) == []
