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
    routed them to, or (engine logs alone) a completed prefill leg with no decode leg anywhere,
    or a decode leg with no prefill leg: either way a node's log lacks a leg, and which node it
    is the logs may not say.

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


# A client request is a twin of an engine request when both ask for the same prompt length this
# close in time; a length this long is rare enough that chance twins stay few.
TWIN_MIN_PROMPT = 1024
# Client requests with no engine leg whose twins are looked for (the first in time): enough to
# tell a pattern, bounded whatever the case's size.
TWIN_SAMPLE = 20_000


def keying_warnings(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """A warning when the client log and the engine logs share few requests although they cover
    the same hours: most successful client requests have no engine leg while about as many
    engine requests have no client record. Then the logs either name the same requests by
    different ids (a gateway's own id, not the engine's rid) or are of different traffic. In the
    first case every response the engines logged is judged twice, once from each side, and the
    engine-side requests, the sources among them, name no tenant: the recipient and source counts
    would read as an all-clear they are not. Twins (a client request with no leg and an engine
    request with no client record of the same prompt length within a minute) tell the two apart.
    Run after :func:`assess` (it reads ``coverage_unlogged``).
    """
    from forensics.sql import first_row
    from forensics.terminal import plural

    # Joins and filters only: the same statement runs on Spark.
    overlap = """overlap AS (
          SELECT greatest(c.lo, e.lo) AS lo, least(c.hi, e.hi) AS hi
          FROM (SELECT min(received_at) AS lo, max(received_at) AS hi FROM scoped_requests) c,
               (SELECT min(started_at) AS lo, max(started_at) AS hi FROM engine_legs) e
        )"""
    found = first_row(
        con,
        f"""WITH {overlap},
        answered AS (
          SELECT count(*) AS n FROM scoped_requests r, overlap o
          WHERE r.http_status BETWEEN 200 AND 299 AND r.received_at BETWEEN o.lo AND o.hi
        ),
        unlogged AS (
          SELECT count(*) AS n FROM coverage_unlogged u, overlap o
          WHERE NOT u.logged AND u.received_at BETWEEN o.lo AND o.hi
        ),
        engine AS (
          SELECT count(*) AS n FROM engine_requests e, overlap o
          WHERE e.received_at BETWEEN o.lo AND o.hi
        )
        SELECT a.n, u.n, e.n FROM answered a, unlogged u, engine e""",
    )
    answered, unlogged, engine = (int(v or 0) for v in (found or (0, 0, 0)))
    if not answered or not engine or not unlogged:
        return []
    twins = first_row(
        con,
        f"""WITH {overlap},
        lone AS (
          SELECT r.request_id, r.received_at, r.prompt_tokens
          FROM coverage_unlogged u
          JOIN scoped_requests r ON r.request_id = u.request_id, overlap o
          WHERE NOT u.logged AND r.prompt_tokens >= $min_prompt
            AND u.received_at BETWEEN o.lo AND o.hi
          ORDER BY r.received_at, r.request_id
          LIMIT $sample
        ),
        twinned AS (
          SELECT DISTINCT l.request_id
          FROM lone l
          JOIN engine_requests e
            ON e.prompt_tokens = l.prompt_tokens
           AND e.received_at BETWEEN l.received_at - INTERVAL 1 MINUTE
                                 AND l.received_at + INTERVAL 1 MINUTE
        )
        SELECT count(*), count(t.request_id)
        FROM lone l LEFT JOIN twinned t ON t.request_id = l.request_id""",
        {"min_prompt": TWIN_MIN_PROMPT, "sample": TWIN_SAMPLE},
    )
    sampled, twinned = (int(v or 0) for v in (twins or (0, 0)))
    named_apart = twinned >= 20 and twinned * 10 >= sampled
    few_shared = answered >= 100 and unlogged * 2 >= answered and engine * 2 >= unlogged
    if not (named_apart or few_shared):
        return []
    counts = (
        f"{unlogged:,} of {answered:,} successful client requests have no engine leg and"
        f" {plural(engine, 'engine request')} no client record, over the hours both logs cover"
    )
    cost = (
        "a response the engines logged under another id is judged twice, once from each log"
        " (and counted twice among the affected), and the engine-side requests, the sources"
        " they read among them, name no tenant: the recipient and source counts are floors,"
        " not an all-clear. Give the client records the engine's request id (request_id, or"
        " bootstrap_room) and ingest again."
    )
    if named_apart:
        text = (
            "The client log and the engine logs name the same requests by different ids:"
            f" {twinned:,} of {plural(sampled, 'client request')} of at least"
            f" {TWIN_MIN_PROMPT:,} prompt tokens with no engine leg have an engine request with"
            f" no client record of the same prompt length within a minute; {counts}. So"
            f" {cost}"
        )
    else:
        text = (
            f"The client log and the engine logs share few requests: {counts}. If the engine"
            " logs are of this traffic, they name its requests by other ids than the client"
            f" log: {cost} If they are of other traffic (another fleet or model), the client"
            " requests were judged without the engines' evidence."
        )
    return [("logs_keyed_apart", text)]


# Nodes an unlogged node is named among in one warning; the rest are counted.
NAMED_NODES = 5


def unlogged_node_warnings(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """A warning for each side (prefill, decode) with nodes that served traffic but whose log
    was not loaded at all: the client log routed successful requests there, or (engine logs
    alone) the node reported its KV pool while completed prefills have no decode leg anywhere,
    or decode legs no prefill leg.
    Coverage counts those requests, but a count of missing legs does not tell a responder which
    file to fetch, and with no client log the responses such a node served over stale pages
    stay unresolved leads (``rejection_unresolved``), not notices. A node that reported its
    pool and served nothing the logs show is not named: a spare is not a gap.
    Run after :func:`assess` (it reads ``findings_coverage`` and ``coverage_missing_legs``).
    """
    from forensics.sql import scalar
    from forensics.terminal import plural

    rows = con.execute(
        # Joins and filters only: the same statement runs on Spark.
        """WITH logged AS (
             SELECT DISTINCT node, replace(scope, 'engine_legs:', '') AS role
             FROM findings_coverage WHERE scope LIKE 'engine_legs:%'
           ),
           unlogged AS (
             SELECT role AS side, node FROM coverage_missing_legs WHERE node IS NOT NULL
             UNION
             SELECT 'prefill', node FROM pool_snapshots WHERE coalesce(role, 'prefill') = 'prefill'
             UNION
             SELECT 'decode', node FROM pool_snapshots WHERE coalesce(role, 'decode') = 'decode'
           ),
           routed AS (
             SELECT role, node, count(*) AS n FROM coverage_missing_legs GROUP BY role, node
           )
           SELECT u.side, u.node, coalesce(r.n, 0) AS routed, coalesce(a.n, 0) AS anywhere
           FROM unlogged u
           LEFT JOIN logged l ON l.node = u.node AND (l.role = u.side OR l.role = 'unified')
           LEFT JOIN routed r ON r.role = u.side AND r.node = u.node
           LEFT JOIN routed a ON a.role = u.side AND a.node IS NULL
           WHERE l.node IS NULL AND (r.n > 0 OR a.n > 0)
           ORDER BY routed DESC, u.node"""
    ).fetchall()
    unresolved, unplaced = (
        scalar(con, f"SELECT count(*) FROM findings_signals WHERE signal = '{signal}'")
        for signal in ("rejection_unresolved", "over_pool_unplaced")
    )
    out = []
    for side in ("decode", "prefill"):
        nodes = [(node, routed, anywhere) for s, node, routed, anywhere in rows if s == side]
        if not nodes:
            continue
        names = ", ".join(node for node, _, _ in nodes[:NAMED_NODES])
        if len(nodes) > NAMED_NODES:
            names += f" and {plural(len(nodes) - NAMED_NODES, 'more')}"
        one = len(nodes) == 1
        routed = sum(n for _, n, _ in nodes)
        anywhere = nodes[0][2]
        evidence = []
        if routed:
            evidence.append(
                f"the client log routed at least {plural(routed, 'successful request')} there"
            )
        if anywhere and any(not n for _, n, _ in nodes):
            has = "has" if anywhere == 1 else "have"
            evidence.append(
                f"{'it' if one else 'they'} reported a KV pool while"
                + (
                    f" {plural(anywhere, 'engine request')} whose prefill completed {has}"
                    " no decode leg anywhere"
                    if side == "decode"
                    else f" {plural(anywhere, 'engine request')} with a decode leg {has} no"
                    " prefill leg anywhere"
                )
            )
        if side == "decode":
            consequence = (
                "the responses decoded there are judged from the other logs alone, their"
                " sources attributed from client times where a client record exists and not"
                " at all where none does"
            )
            if unresolved:
                consequence += (
                    f"; {plural(unresolved, 'prefill rejection')} of requests with no other"
                    " record stay unresolved (possible, not notified) and may have been"
                    " answered there"
                )
        else:
            consequence = (
                "the prompts prefilled there are judged from the other logs alone: a rejection"
                " logged there, or a prompt cut short on its way to decode, is not seen"
            )
            if unplaced:
                consequence += (
                    f"; {plural(unplaced, 'answered prompt')} with no prefill node on record"
                    " reached the smallest prefill limit in force but not the largest, and stay"
                    " possible (over_pool_unplaced), not notified: the limit of the node that"
                    " took them would settle it"
                )
        out.append(
            (
                "node_unlogged",
                f"No {side} log was loaded for {names}, though {' and '.join(evidence)}:"
                f" {consequence}. Load {'its' if one else 'their'} log and detect again"
                + (
                    # A client log that names nodes otherwise than the engines (an address
                    # for a host name) reads the same way: say so rather than assert a loss.
                    ", or, if it was loaded, give the client records the node names the"
                    " engine logs use."
                    if routed
                    else "."
                ),
            )
        )
    return out
