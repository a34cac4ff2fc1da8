"""``forensics canary``: every hour, marker prompts around the limit against a live server."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from forensics.app import app, handle_errors
from forensics.commands.gate import (
    JSON_OPT,
    check_base_url_option,
    context_length_option,
    timeout_option,
)

if TYPE_CHECKING:
    from forensics.canary import CanaryReport, Probe


def _check_requests(value: int) -> int:
    # The library's bounds, checked while parsing so that a bad count is a usage error.
    from forensics.canary import MAX_REQUESTS, MIN_REQUESTS

    if not MIN_REQUESTS <= value <= MAX_REQUESTS:
        raise typer.BadParameter(f"{value} is not in the range {MIN_REQUESTS} to {MAX_REQUESTS}")
    return value


def _check_rate(value: float) -> float:
    from forensics.canary import MAX_RATE

    if not 0 < value <= MAX_RATE:
        raise typer.BadParameter(f"{value:g} is not above 0 and at most {MAX_RATE:g} per second")
    return value


def _check_limit(value: int | None) -> int | None:
    from forensics.canary import MIN_LIMIT

    if value is not None and value < MIN_LIMIT:
        # Calibration and the shortest ordinary prompts must fit well under the limit.
        raise typer.BadParameter(
            f"{value} is below the smallest limit the canary straddles, {MIN_LIMIT}"
        )
    return value


@app.command()
@handle_errors
def canary(
    base_url: str = typer.Argument(
        ...,
        metavar="BASE_URL",
        callback=check_base_url_option,
        help="The server root, http://host:port (it posts to /v1/chat/completions).",
        show_default=False,
    ),
    model: str = typer.Option(
        ..., "--model", metavar="NAME", help="The model name to ask for.", show_default=False
    ),
    requests: int = typer.Option(
        12,
        "--requests",
        "-n",
        metavar="N",
        callback=_check_requests,
        help="Prompts to send in all, two calibration prompts included (10 to 64).",
    ),
    limit_tokens: int | None = typer.Option(
        None,
        "--limit-tokens",
        metavar="N",
        callback=_check_limit,
        help="The input limit to straddle (default: max_req_input_len from /get_server_info).",
        show_default=False,
    ),
    context_length: int | None = context_length_option(
        "The advertised context, for the near-context prompt (default: the endpoint's)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        metavar="DIR",
        help="Write the run as canonical requests evidence, DIR/<run id>.jsonl.",
        show_default=False,
    ),
    rate: float = typer.Option(
        1.0,
        "--rate",
        metavar="PER_SECOND",
        callback=_check_rate,
        help="Requests started per second, at most (up to 20).",
    ),
    timeout: float = timeout_option(300.0, "each answer"),
    as_json: bool = JSON_OPT,
) -> None:
    """Every hour: marker prompts around the limit, looking for leaks.

    Prompts carry unique markers and straddle the input limit (just under, at, just over,
    near the context) among ordinary lengths. A reply holding another request's marker is a
    leak; a prompt at or over the limit must be refused (4xx); a first token impossibly fast
    for the prompt's length is flagged (the case detector latency_too_good). Exit 1 on a
    leak or an over-limit prompt answered.
    """
    from forensics.canary import run_canary

    report = run_canary(
        base_url,
        model,
        requests=requests,
        limit_tokens=limit_tokens,
        context_length=context_length,
        out=out,
        rate=rate,
        timeout=timeout,
    )
    if as_json:
        import json

        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print(report)
    if not report.passed:
        raise typer.Exit(1)


def _print(report: CanaryReport) -> None:
    from forensics.terminal import Col, Grid, make_console, plural, shown, styled

    console = make_console()
    context = f"{report.context_length:,}" if report.context_length else "unknown"
    console.print(
        f"Canary against {report.base_url} (model {report.model}): limit "
        f"{report.limit_tokens:,} tokens (from {report.limit_source}), context {context}"
    )
    grid = Grid(
        "",
        [
            Col("request"),
            Col("kind"),
            Col("tokens", right=True),
            Col("status", right=True),
            Col("ttft ms", right=True),
            Col("outcome", wrap=True),
        ],
    )
    for p in report.probes:
        ttft = f"{p.ttft_ms:,.1f}" if p.ttft_ms is not None else "-"
        grid.add_row(
            p.request_id, p.kind, f"{p.tokens:,}", str(p.http_status), ttft, report.outcome(p)
        )
    grid.print(console)

    def who(p: Probe | None) -> str:
        return f"{p.request_id} ({p.kind}, {p.tokens:,} tokens)" if p else "no request of this run"

    for leak in report.leaks:
        console.print(
            styled(
                ("LEAK: ", "bold red"),
                f"{who(leak.recipient)} received the marker {leak.marker} of {who(leak.source)}",
            )
        )
    for p in report.over_limit_answered:
        console.print(
            styled(
                ("Answered over the limit: ", "bold red"),
                f"{who(p)}, at or over {report.limit_tokens:,}, got HTTP {p.http_status} "
                "instead of a 4xx refusal",
            )
        )
    for p, detail in report.ttft_flagged:
        console.print(styled(("TTFT too fast: ", "yellow"), f"{p.request_id}: {detail}"))
    for warning in report.warnings:
        console.print(styled(("warning: ", "yellow"), warning))
    if report.records:
        console.print(
            f"Records: {shown(report.records)} ({plural(len(report.probes), 'request')}); "
            f"load into a case with `forensics ingest DB {shown(report.records)} --kind requests`"
        )
    refused = sum(1 for p in report.probes if p.tokens >= report.limit_tokens and not p.answered)
    if report.passed:
        console.print(
            styled(
                ("Canary: pass", "bold green"),
                f": no leak; {plural(refused, 'prompt')} at or over the limit refused.",
            )
        )
    else:
        console.print(
            styled(
                ("Canary: FAIL", "bold red"),
                f": {plural(len(report.leaks), 'leak')}, "
                f"{plural(len(report.over_limit_answered), 'over-limit prompt')} answered.",
            )
        )
