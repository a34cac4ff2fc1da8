"""What the report shows of the whole traffic, summarised at the end of detection.

Scoping and the report read the findings and the small evidence tables only (tenants, pool
snapshots, the evidence and rejects records): never ``requests``, ``engine_legs`` or
``kv_allocations``, which grow with the traffic. What the report needs of those beyond the
findings is written here (``sql/summary.sql``), by whichever engine ran detection: so a
detection on Spark over evidence the case database never held leaves the report everything it
reads, and the report costs the same whatever the traffic.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

# The tokens-against-TTFT chart's points: at most this many flagged requests and this many of
# the rest, each a sample by a hash of the request id.
FLAGGED_SAMPLE = 3000
PLAIN_SAMPLE = 1500


def summarise(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> dict[str, Any]:
    """Write ``findings_tenants``, ``findings_ttft_sample``, ``findings_source_requests`` and
    the ``ttft_chart`` case statement (the chart's counts and the expected-TTFT line's two
    points); returns that statement."""
    from forensics.sql import first_row, run_sql_file

    ctx = params.get("context_length")
    # The context window is the one detection was prepared with (``detect_params``).
    run_sql_file(
        con, "summary.sql", {"flagged_sample": FLAGGED_SAMPLE, "plain_sample": PLAIN_SAMPLE}
    )
    flagged, plain = first_row(
        con,
        """SELECT (SELECT count(*) FROM summary_ttft_requests t
                   JOIN findings_affected a USING (request_id)),
                  (SELECT count(*) FROM summary_ttft_requests t
                   ANTI JOIN findings_affected a USING (request_id))""",
    )
    beyond = 0
    if ctx:
        beyond = first_row(
            con,
            """SELECT count(*) FROM requests r
               WHERE r.prompt_tokens > 0 AND ttft_ms(r.ttft_ms, r.received_at, r.first_token_at) > 0
                 AND r.prompt_tokens >= $ctx""",
            {"ctx": ctx},
        )[0]
    statement = {
        "flagged": int(flagged),
        "plain": int(plain),
        "beyond_context": int(beyond),
        "fit": _latency_fit(con),
    }
    con.execute("DROP VIEW IF EXISTS summary_ttft_requests")
    con.execute(
        "INSERT INTO findings_case VALUES ('ttft_chart', $v)",
        {"v": json.dumps(statement, sort_keys=True)},
    )
    return statement


def _latency_fit(con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    """Two points of the expected-TTFT line latency_too_good fitted: its detector parameters
    and, at the shortest and the longest prompt it flagged, the threshold it applied (the
    factor times the expected TTFT there). None when it flagged nothing."""
    rows = con.execute(
        """SELECT d.parameters, min(r.prompt_tokens), max(r.prompt_tokens),
                  arg_min(s.threshold, r.prompt_tokens), arg_max(s.threshold, r.prompt_tokens)
           FROM findings_signals s
           JOIN requests r USING (request_id)
           JOIN findings_detectors d ON d.detector_id = s.detector_id
           WHERE s.signal = 'latency_too_good' AND s.threshold > 0 AND r.prompt_tokens > 0
           GROUP BY d.parameters
           ORDER BY d.parameters"""
    ).fetchall()
    if not rows:
        return None
    params, lo, hi, t_lo, t_hi = rows[0]
    return {
        "parameters": json.loads(params),
        "lo_tokens": int(lo),
        "hi_tokens": int(hi),
        "lo_threshold": float(t_lo),
        "hi_threshold": float(t_hi),
    }
