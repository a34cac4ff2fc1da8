"""``forensics detect`` and ``forensics explain``."""

from __future__ import annotations

from pathlib import Path

import typer

from forensics.cli import MEMORY_OPT, app, handle_errors


@app.command()
@handle_errors
def detect(
    case_path: Path = typer.Argument(..., help="The case manifest (case.toml)."),
    memory_limit: str | None = MEMORY_OPT,
) -> None:
    """Run every detector and write the findings tables."""
    from rich.console import Console
    from rich.table import Table

    from forensics.db import open_case, transaction
    from forensics.detect import detect_case

    case, con = open_case(case_path, memory_limit)
    # Findings are replaced whole or not at all: a detection that is killed or fails leaves
    # the previous findings, which a report can still read.
    with transaction(con):
        summary = detect_case(con, case)
    console = Console()
    table = Table(title="Detectors")
    table.add_column("detector")
    table.add_column("hits", justify="right")
    for det, hits in summary.hits.items():
        table.add_row(det, f"{hits:,}")
    console.print(table)
    v = summary.verdicts
    console.print(
        f"Verdicts: {v['confirmed']} confirmed, {v['likely']} likely, {v['possible']} possible;"
        f" {summary.exposures:,} exposures attributed."
    )
    for w in summary.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")


@app.command()
@handle_errors
def explain(
    case_path: Path = typer.Argument(..., help="The case manifest (case.toml)."),
    request_id: str = typer.Argument(..., help="The client request id."),
) -> None:
    """Every signal and exposure for one request, with the evidence rows behind it."""
    from forensics.db import open_case
    from forensics.explain import explain_request

    case, con = open_case(case_path)
    e = explain_request(con, request_id)
    echo = typer.echo
    r = e.request
    echo(f"Request {r['request_id']} (tenant {r['tenant_id'] or 'unknown'})")
    if r.get("client_record") is False:
        echo("  no client record: this is the engine's view of the request (its decode leg)")
    echo(
        f"  received {r['received_at']}, HTTP {r['http_status']}, prompt {r['prompt_tokens']:,}"
        f" tokens, completion {r['completion_tokens']}, TTFT {r['ttft_ms']} ms"
    )
    echo(
        f"  prefill {r['prefill_node']}, decode {r['decode_node']} rank {r['dp_rank']},"
        f" bootstrap_room {r['bootstrap_room']}"
    )
    echo(f"  evidence: {r['evidence_path']} row {r['source_row']}")
    for leg in e.legs:
        echo(
            f"  {leg['role']} leg on {leg['node']}: held {leg['input_tokens']},"
            f" reserved {leg['reserved_tokens']}, transferred {leg['transferred_tokens']}"
            f" ({leg['evidence_path']} row {leg['source_row']})"
        )
        if leg["error"]:
            echo(f"    error: {leg['error']}")
    if not e.signals:
        echo("Signals: none")
    for s in e.signals:
        echo(
            f"Signal {s['signal']}: value {s['value']:,.1f}, threshold "
            f"{'-' if s['threshold'] is None else format(s['threshold'], ',.1f')}: {s['detail']}"
        )
        for ev in s["evidence"]:
            echo(f"    from {ev['table']} evidence #{ev['evidence_id']} row {ev['source_row']}")
    if e.verdict:
        echo(
            f"Verdict: {e.verdict['verdict']} ({e.verdict['signals']}), limit"
            f" {e.verdict['threshold_tokens']}"
        )
        if e.verdict["note"]:
            echo(f"  note: {e.verdict['note']}")
    else:
        echo("Verdict: not affected")
    echo(f"Excluded by: {', '.join(e.exclusions) if e.exclusions else 'none'}")
    echo(f"Read other requests' KV ({len(e.as_recipient)}):")
    for x in e.as_recipient:
        echo(
            f"  {x['source_request_id']} of {x['source_tenant_id']}: {x['tokens']:,} tokens,"
            f" {x['method']} ({x['confidence']})"
        )
    echo(f"Its KV was read by ({len(e.as_source)}):")
    for x in e.as_source:
        echo(
            f"  {x['recipient_request_id']} of {x['recipient_tenant_id']}: {x['tokens']:,}"
            f" tokens, {x['method']} ({x['confidence']})"
        )
