"""``forensics detect`` and ``forensics explain``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from forensics.app import (
    CASE_ARG,
    ENGINE_OPT,
    IN_PLACE_OPT,
    MEMORY_OPT,
    SPARK_CONF_OPT,
    SPARK_MASTER_OPT,
    app,
    handle_errors,
    with_engine,
)
from forensics.verdicts import NOTIFIED_VERDICTS

if TYPE_CHECKING:
    from rich.console import Console

    from forensics.explain import Explanation


@app.command()
@handle_errors
def detect(
    case_path: Path = CASE_ARG,
    memory_limit: str | None = MEMORY_OPT,
    engine: str | None = ENGINE_OPT,
    spark_master: str | None = SPARK_MASTER_OPT,
    spark_conf: list[str] | None = SPARK_CONF_OPT,
    in_place: bool = IN_PLACE_OPT,
) -> None:
    """Run every detector and write the findings tables."""
    from forensics.case import load_case
    from forensics.db import open_case
    from forensics.pipeline import detect_and_scope
    from forensics.terminal import (
        Col,
        Grid,
        Steps,
        make_console,
        plural,
        styled,
        warning_lines,
    )

    # Options that contradict each other or the manifest are usage errors, before anything.
    chosen = with_engine(load_case(case_path), engine, spark_master, spark_conf, in_place)
    case, con = open_case(case_path, memory_limit, create=chosen.engine.in_place)
    try:
        case = with_engine(case, engine, spark_master, spark_conf, in_place)
        with Steps(make_console(stderr=True)) as steps:
            summary, _ = detect_and_scope(con, case, progress=steps.step)
    finally:
        con.close()
    console = make_console()
    grid = Grid("Detectors", [Col("detector"), Col("hits", right=True)])
    for det, hits in summary.hits.items():
        grid.add_row(det, f"{hits:,}")
    grid.print(console)
    v = summary.verdicts
    excluded = f" ({summary.excluded:,} of the confirmed and likely to excluded traffic)"
    console.print(
        f"Verdicts: {v['confirmed']:,} confirmed, {v['likely']:,} likely, "
        f"{v['possible']:,} possible{excluded if summary.excluded else ''}; "
        f"{plural(summary.exposures, 'exposure')} attributed."
    )
    for w in warning_lines(summary.warnings, summary.warning_codes):
        console.print(styled(("warning: ", "yellow"), w))


@app.command()
@handle_errors
def explain(
    case_path: Path = CASE_ARG,
    request_id: str = typer.Argument(
        ...,
        metavar="REQUEST_ID",
        help="The request id (the client's, or the engine's when the client log has none).",
        show_default=False,
    ),
) -> None:
    """Explain one request: records, signals, verdict, exposures.

    Its client record (or the engine's view), each engine leg, the limit in force, every
    signal with its evidence rows, the verdict and why, and whose KV it read or lent.
    """
    from forensics.db import open_case
    from forensics.explain import explain_request
    from forensics.terminal import make_console

    case, con = open_case(case_path)
    try:
        explanation = explain_request(con, request_id, case)
    finally:
        con.close()
    render_explanation(make_console(), explanation)


def _n(value: Any, unit: str = "") -> str:
    """A count with its unit, or "not logged"."""
    if value is None:
        return "not logged"
    count = int(value)
    return f"{count:,}" + (f" {unit}{'' if count == 1 else 's'}" if unit else "")


def _ms(value: Any) -> str:
    return "not logged" if value is None else f"{value:,.1f} ms"


def _at(path: str | None, row: int | None) -> str:
    return f"{path or 'unknown file'} row {row}"


def render_explanation(console: Console, e: Explanation) -> None:
    """One request's story, each line whole: who sent it and what came back, what each engine
    leg did, the limit it met, every signal with its evidence rows, the verdict and why, who
    else's KV it read and who read its own."""
    from forensics.terminal import styled, utc

    r = e.request
    say = console.print
    verdict = e.verdict["verdict"] if e.verdict else "not affected"
    say(
        styled(
            ("Request ", "bold"),
            (r["request_id"], "bold"),
            f" (tenant {r['tenant_id'] or 'unknown'}): {verdict}",
        )
    )
    if r.get("client_record") is False:
        say(
            "Client's view: not logged (no client record: this is the engine's view of the "
            f"request, from its decode leg, {_at(r['evidence_path'], r['source_row'])})"
        )
        reserved = _n(r["prompt_tokens"], "token")
        say(f"  started {utc(r['received_at'])}; the decode leg reserved {reserved}")
    else:
        say(f"Client's view: {_at(r['evidence_path'], r['source_row'])}")
        model = f", model {r['model']}" if r.get("model") else ""
        say(f"  received {utc(r['received_at'])}{model}")
        completion = r.get("completion_tokens")
        answer = (
            f"with {_n(completion, 'token')}"
            if completion is not None
            else "(completion not logged)"
        )
        say(
            f"  prompt {_n(r['prompt_tokens'], 'token')}; answered HTTP {_n(r['http_status'])} "
            f"{answer}; first token after {_ms(r.get('ttft_ms'))}"
        )
        rank = "rank not logged" if r.get("dp_rank") is None else f"rank {r['dp_rank']}"
        say(
            f"  routed to prefill {r.get('prefill_node') or 'not logged'}, decode "
            f"{r.get('decode_node') or 'not logged'} {rank}, bootstrap room "
            f"{r.get('bootstrap_room') or 'not logged'}"
        )
        sender = [
            f"API key {r['api_key_id']}" if r.get("api_key_id") else "",
            f"client {r['client_ip']}" if r.get("client_ip") else "",
            f"user agent {r['user_agent']}" if r.get("user_agent") else "",
        ]
        if any(sender):
            say("  sent with " + ", ".join(s for s in sender if s))
    _legs(console, e)
    _limit(console, e)
    _signals(console, e)
    say(styled(("Verdict: ", "bold"), (verdict, "bold"), f" ({e.reason})."))
    say(_consequence(e))
    _exposures(console, e)


def _legs(console: Console, e: Explanation) -> None:
    from forensics.terminal import utc

    if not e.legs:
        console.print("Engine legs: none logged")
        return
    console.print(f"Engine legs ({len(e.legs)}):")
    for leg in e.legs:
        where = leg["node"] + (f" rank {leg['dp_rank']}" if leg.get("dp_rank") is not None else "")
        moved = "sent" if leg["role"] == "prefill" else "received"
        console.print(
            f"  {leg['role']} on {where}: input {_n(leg['input_tokens'], 'token')}, reserved "
            f"{_n(leg['reserved_tokens'])}, {moved} {_n(leg['transferred_tokens'])}"
        )
        console.print(
            f"    started {utc(leg['started_at'])}, {_at(leg['evidence_path'], leg['source_row'])}"
        )
        if leg.get("error"):
            console.print(f"    error: {leg['error']}")
        timings = _stage_timings(leg.get("extra"))
        if timings:
            # A decode leg's start is when its pages were allocated, which this line explains.
            console.print(f"    stage timings: {timings}")


def _stage_timings(extra: Any) -> str | None:
    """The engine's own stage-timing line of a leg, as its adapter kept it in ``extra``."""
    import json

    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            return None
    return extra.get("time_stats") if isinstance(extra, dict) else None


def _limit(console: Console, e: Explanation) -> None:
    limit = e.limit
    if limit is None:
        console.print("Limit in force: not known (no pool snapshot and no default pool size)")
        return
    row = _at(limit.get("evidence_path"), limit.get("source_row"))
    source = {
        "pool_snapshots": f"from {row}",
        "engine_legs": f"from the rejection logged in {row}",
        "default_pool_tokens": "implied by [detection].default_pool_tokens: no snapshot covers "
        "the node",
        "largest prefill limit in force (node unknown)": "the largest in force on any prefill "
        "node: no record names its node",
    }.get(limit["source"], limit["source"])
    node = f" on {limit['node']}" if limit.get("node") else ""
    gap = e.request["prompt_tokens"] - limit["tokens"]
    where = f"{gap:,} tokens over it" if gap >= 0 else f"{-gap:,} tokens under it"
    if gap == 0:
        where = "exactly at it"
    console.print(
        f"Limit in force: {limit['tokens']:,} tokens{node} ({source}); the prompt is {where}"
    )


def _signal_sentence(s: dict[str, Any], e: Explanation) -> str:
    """What a signal says, in words that agree with the legs printed above."""
    value, threshold, leg = s["value"], s["threshold"], s.get("leg")
    r = e.request
    answered = (
        f"the client got HTTP {r['http_status']}"
        if r.get("client_record") is not False
        else "the decode leg completed"
    )
    if s["signal"] == "prefill_rejected":
        node = leg["node"] if leg else "the prefill"
        stated = f"limit {_n(threshold, 'token')}" if threshold is not None else "limit not stated"
        return f"{node} logged the input-length rejection ({stated}), yet {answered}"
    if s["signal"] == "over_pool":
        return (
            f"the prompt ({_n(value, 'token')}) is at or over the limit in force "
            f"({_n(threshold, 'token')}), below the context length, and the decode pool could "
            "hold it"
        )
    if s["signal"] == "over_pool_unplaced":
        return (
            f"the prompt ({_n(value, 'token')}) is at or over the smallest prefill limit in force "
            f"({_n(threshold, 'token')}) but under another node's, and no record names the node "
            "that took it"
        )
    if s["signal"] == "token_mismatch" and leg:
        if leg["role"] == "decode":
            of = "it reserved" if leg.get("reserved_tokens") == threshold else "of the prompt"
            return (
                f"the decode leg on {leg['node']} received {_n(value)} of the "
                f"{_n(threshold, 'token')} {of}"
            )
        return (
            f"the {leg['role']} leg on {leg['node']} held {_n(value)} of the client's "
            f"{_n(threshold, 'prompt token')}"
        )
    if s["signal"] == "latency_too_good" and threshold:
        factor = e.parameters.get("latency_factor")
        cached = e.request.get("cached_tokens") or 0
        # The expectation is for what prefill had to compute: the prompt less its cache hit.
        what = (
            f"the {e.request['prompt_tokens'] - cached:,} tokens of this prompt not cached"
            if cached
            else "a prompt this long"
        )
        expected = (
            f", where this case's own traffic takes about {threshold / factor:,.0f} ms for {what}"
            if factor
            else ""
        )
        return f"first token after {value:,.1f} ms{expected} (flagged below {threshold:,.1f} ms)"
    return s["detail"] or s["signal"]


# Signals from the strongest evidence to the weakest (the README's order); others after.
_SIGNAL_ORDER = (
    "prefill_rejected",
    "over_pool",
    "token_mismatch",
    "over_pool_unplaced",
    "latency_too_good",
)


def _signals(console: Console, e: Explanation) -> None:
    if not e.signals:
        console.print("Signals: none")
        return
    console.print(f"Signals ({len(e.signals)}):")
    known = {name: i for i, name in enumerate(_SIGNAL_ORDER)}
    for s in sorted(e.signals, key=lambda s: (known.get(s["signal"], len(known)), s["signal"])):
        console.print(f"  {s['signal']}: {_signal_sentence(s, e)}")
        rows = dict.fromkeys(
            _at(ev.get("path") or f"{ev['table']} evidence #{ev['evidence_id']}", ev["source_row"])
            for ev in s["evidence"]
        )
        if rows:
            console.print(f"    evidence: {'; '.join(rows)}")


def _consequence(e: Explanation) -> str:
    """What the verdict and the exclusions mean for the request's tenant (the rules of
    ``scope.py``, as the README states them)."""
    names = [
        f"{name} ({reason})" if reason else name for name, reason in e.exclusion_reasons.items()
    ]
    excluded = f"Excluded by {', '.join(names)}" if names else ""
    verdict = e.verdict["verdict"] if e.verdict else None
    if verdict in NOTIFIED_VERDICTS:
        if excluded:
            return (
                f"{excluded}: its tenant is not notified as a recipient; the tenants whose "
                "data it read still are."
            )
        if not e.request.get("tenant_id"):
            return (
                "Its tenant is unknown: it is on the review list until its request id is mapped "
                "to a tenant."
            )
        return "Its tenant is notified as a recipient."
    if verdict == "possible":
        return (excluded + ". " if excluded else "") + (
            "Listed for review: nobody is told until a responder decides."
        )
    return (excluded + ".") if excluded else "Not excluded by any rule."


def _exposures(console: Console, e: Explanation) -> None:
    from forensics.terminal import plural

    say = console.print
    a = e.attribution
    how = ""
    if a:
        rank = f" rank {a['dp_rank']}" if a.get("dp_rank") is not None else ""
        how = f"; sources {a['status']} ({a['method']} on {a['node']}{rank})"
        if a.get("note"):
            how += f": {a['note']}"
    if e.as_recipient:
        tenants = {x["source_tenant_id"] for x in e.as_recipient}
        tokens = sum(x["tokens"] or 0 for x in e.as_recipient)
        say(
            f"Read other requests' KV: {plural(len(e.as_recipient), 'exposure')} from "
            f"{plural(len(tenants), 'tenant')}, {plural(tokens, 'token')}{how}"
        )
        for x in e.as_recipient:
            say(f"  {_exposure(x, 'source')}")
    else:
        say(f"Read other requests' KV: none{' found' if a else ''}{how}")
    if e.as_source:
        recipients = {x["recipient_tenant_id"] for x in e.as_source}
        say(f"Its KV was read by: {len(e.as_source):,} responses of {len(recipients):,} tenants")
        for x in e.as_source:
            say(f"  {_exposure(x, 'recipient')}")
    else:
        say("Its KV was read by: none")


def _exposure(x: dict[str, Any], side: str) -> str:
    tenant = x[f"{side}_tenant_id"] or "unknown tenant"
    tokens = "tokens unknown" if x["tokens"] is None else _n(x["tokens"], "token")
    excluded = x.get(f"{side}_excluded_by")
    marked = f", excluded traffic ({excluded})" if excluded else ""
    return (
        f"{x[f'{side}_request_id']} of {tenant}: {tokens}, {x['method']} "
        f"({x['confidence']}){marked}"
    )
