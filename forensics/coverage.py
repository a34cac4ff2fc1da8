"""Log coverage: per node and side, the span of the evidence, its gaps, and one-sided requests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb


def assess(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> dict[str, Any]:
    """Fill findings_coverage and state, for the summary, how far the logs can be trusted."""
    import json

    from forensics.schema import FINDINGS_DDL
    from forensics.sql import first_row, run_sql_file

    con.execute(FINDINGS_DDL["findings_coverage"])
    # A node silent this long while others work is a hole worth stating ([detection]).
    run_sql_file(con, "coverage.sql", {"gap_s": params["coverage_gap_s"]})
    holes, client_only, engine_only, engine_rows = first_row(
        con,
        """SELECT coalesce(sum(gap_count) FILTER (WHERE scope = 'requests'
                                               OR scope LIKE 'engine_legs:%'), 0),
                  coalesce(sum(rows) FILTER (WHERE scope = 'client_only'), 0),
                  coalesce(sum(rows) FILTER (WHERE scope = 'engine_only'), 0),
                  coalesce(sum(rows) FILTER (WHERE scope LIKE 'engine_legs:%'), 0)
           FROM findings_coverage""",
    )
    # Requests, not rows: one may lack both its prefill and its decode leg.
    [(missing,)] = con.execute(
        "SELECT count(DISTINCT request_id) FROM coverage_missing_legs"
    ).fetchall()
    statement = coverage_statement(
        int(holes), int(client_only), int(engine_only), int(engine_rows), int(missing)
    )
    con.execute(
        "INSERT INTO findings_case VALUES ('coverage', $v)",
        {"v": json.dumps(statement, sort_keys=True)},
    )
    return statement


def coverage_statement(
    holes: int, client_only: int, engine_only: int, engine_rows: int, missing_legs: int = 0
) -> dict:
    """One sentence on coverage that qualifies every conclusion of the report.

    ``missing_legs`` counts requests that have engine legs, but not from a node the client log
    routed them to, or (engine logs alone) a completed prefill leg with no decode leg anywhere:
    either way a node's log lacks a leg, and which node it is the logs may not say.

    >>> coverage_statement(0, 0, 0, 10)["level"]
    'complete'
    >>> coverage_statement(2, 5, 0, 10)["statement"].startswith("Incomplete")
    True
    >>> "3 requests missing an engine leg" in coverage_statement(0, 0, 0, 10, 3)["statement"]
    True
    """
    if engine_rows == 0:
        return {
            "level": "client_only",
            "statement": "Client logs only: no engine legs were loaded, so no finding can be"
            " checked against what the engines did; verdicts rest on prompt lengths, pool"
            " limits and latency.",
            "holes": holes,
            "client_only": client_only,
            "engine_only": engine_only,
            "missing_legs": missing_legs,
        }
    if holes == 0 and client_only == 0 and engine_only == 0 and missing_legs == 0:
        return {
            "level": "complete",
            "statement": "Complete for the window: every client request has its engine legs,"
            " every engine leg its client request, and no log falls silent while the other"
            " side shows work.",
            "holes": 0,
            "client_only": 0,
            "engine_only": 0,
            "missing_legs": 0,
        }
    missing = (
        f" {missing_legs:,} requests missing an engine leg (the prefill or decode log that"
        " should hold it does not),"
        if missing_legs
        else ""
    )
    return {
        "level": "incomplete",
        "statement": f"Incomplete: {holes:,} silence{'' if holes == 1 else 's'} in a log while"
        f" the other side shows work, {client_only:,} requests with no engine leg,{missing}"
        f" {engine_only:,} engine legs with no client request. Findings for those requests"
        " and periods rest on the side that was logged; see Log coverage.",
        "holes": holes,
        "client_only": client_only,
        "engine_only": engine_only,
        "missing_legs": missing_legs,
    }
