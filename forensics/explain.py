"""Everything the case knows about one request: its records, signals, verdict and exposures."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    import duckdb


@dataclass
class Explanation:
    request: dict[str, Any]
    legs: list[dict[str, Any]] = field(default_factory=list)
    signals: list[dict[str, Any]] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    exclusions: list[str] = field(default_factory=list)
    as_recipient: list[dict[str, Any]] = field(default_factory=list)
    as_source: list[dict[str, Any]] = field(default_factory=list)


def _dicts(cur) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _engine_only(con: duckdb.DuckDBPyConnection, request_id: str) -> list[dict[str, Any]]:
    """An engine request with no client record, shaped like one (the engine's view of it)."""
    legs = _dicts(
        con.execute(
            """SELECT l.*, e.path AS evidence_path FROM engine_legs l
               LEFT JOIN evidence e USING (evidence_id)
               WHERE l.request_id = $id ORDER BY l.started_at, l.role""",
            {"id": request_id},
        )
    )
    if not legs:
        return []
    decode = next((g for g in legs if g["role"] in ("decode", "unified")), legs[0])
    prefill = next((g for g in legs if g["role"] == "prefill"), {})
    tenant = con.execute(
        "SELECT any_value(tenant_id) FROM findings_affected WHERE request_id = $id",
        {"id": request_id},
    ).fetchone()
    return [
        {
            "request_id": request_id,
            "tenant_id": tenant[0] if tenant else None,
            "received_at": legs[0]["started_at"],
            "http_status": None,
            "prompt_tokens": decode.get("reserved_tokens") or decode.get("input_tokens") or 0,
            "completion_tokens": None,
            "ttft_ms": None,
            "prefill_node": prefill.get("node"),
            "decode_node": decode.get("node") if decode.get("role") != "prefill" else None,
            "dp_rank": decode.get("dp_rank"),
            "bootstrap_room": decode.get("bootstrap_room"),
            "evidence_path": decode["evidence_path"],
            "source_row": decode["source_row"],
            "client_record": False,
        }
    ]


def explain_request(con: duckdb.DuckDBPyConnection, request_id: str) -> Explanation:
    """Collect one request's evidence rows and findings.

    Raises:
        ForensicsError: the request id is not in the case, or detection has not run.
    """
    found = _dicts(
        con.execute(
            """SELECT r.*, e.path AS evidence_path FROM requests r
           LEFT JOIN evidence e USING (evidence_id) WHERE request_id = $id""",
            {"id": request_id},
        )
    )
    if not found:
        found = _engine_only(con, request_id)
    if not found:
        raise ForensicsError(f"request {request_id!r} is not in this case")
    tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    if "findings_affected" not in tables:
        raise ForensicsError("no findings yet: run `forensics detect` on this case first")
    req = found[0]
    legs = _dicts(
        con.execute(
            """SELECT l.*, e.path AS evidence_path FROM engine_legs l
           LEFT JOIN evidence e USING (evidence_id)
           WHERE l.request_id = $id
              OR (l.bootstrap_room IS NOT NULL AND l.bootstrap_room = $room)
           ORDER BY l.started_at, l.role""",
            {"id": request_id, "room": req.get("bootstrap_room")},
        )
    )
    signals = _dicts(
        con.execute(
            """SELECT signal, detector_id, value, threshold, detail, evidence
           FROM findings_signals WHERE request_id = $id ORDER BY signal""",
            {"id": request_id},
        )
    )
    for s in signals:
        s["evidence"] = json.loads(s["evidence"]) if s["evidence"] else []
    verdict = _dicts(
        con.execute(
            "SELECT verdict, signals, threshold_tokens, excluded_by, note FROM findings_affected"
            " WHERE request_id = $id",
            {"id": request_id},
        )
    )
    exclusions = [
        r[0]
        for r in con.execute(
            "SELECT exclusion FROM findings_excluded WHERE request_id = $id ORDER BY exclusion",
            {"id": request_id},
        ).fetchall()
    ]
    exposure_cols = """source_request_id, source_tenant_id, recipient_request_id,
                       recipient_tenant_id, method, tokens, confidence, rank"""
    as_recipient = _dicts(
        con.execute(
            f"SELECT {exposure_cols} FROM findings_exposures WHERE recipient_request_id = $id"
            " ORDER BY tokens DESC, source_request_id",
            {"id": request_id},
        )
    )
    as_source = _dicts(
        con.execute(
            f"SELECT {exposure_cols} FROM findings_exposures WHERE source_request_id = $id"
            " ORDER BY recipient_request_id",
            {"id": request_id},
        )
    )
    return Explanation(
        req, legs, signals, verdict[0] if verdict else None, exclusions, as_recipient, as_source
    )
