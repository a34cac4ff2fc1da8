"""``forensics gate``: before deploy, check live engines against the advertised context."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from forensics.app import app, handle_errors

if TYPE_CHECKING:
    from forensics.gate import GateReport

JSON_OPT = typer.Option(False, "--json", help="Print JSON for pipelines (shape in the README).")


def context_length_option(help: str):
    """``--context-length N``: the context the platform advertises (gate and canary)."""
    return typer.Option(None, "--context-length", metavar="N", min=1, help=help, show_default=False)


def timeout_option(default: float, what: str):
    """``--timeout SECONDS``: how long to wait for an engine (gate and canary)."""
    return typer.Option(
        default, "--timeout", metavar="SECONDS", min=0.1, help=f"How long to wait for {what}."
    )


def _check_source(value: list[str]) -> list[str]:
    from forensics.endpoint import check_base_url, is_url

    for source in value:
        if is_url(source):
            try:
                check_base_url(source)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
        elif not Path(source).is_file():
            raise typer.BadParameter(
                f"{source} is neither an engine base URL (http://host:port) "
                "nor a saved server_info file"
            )
    return value


def check_base_url_option(value: str) -> str:
    """An engine base URL option or argument; anything else is a usage error."""
    from forensics.endpoint import check_base_url

    try:
        return check_base_url(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _case_context(case_path: Path) -> int:
    """The advertised context a case manifest names (a manifest without one is a usage error;
    a malformed one, a one-line error)."""
    from forensics.app import error
    from forensics.case import load_case
    from forensics.errors import ForensicsError

    try:
        case = load_case(case_path)
    except ForensicsError as exc:
        error(str(exc))
        raise typer.Exit(1) from None
    if case.context_length is None:
        raise typer.BadParameter(
            f"{case_path} sets no [incident].context_length", param_hint="--case"
        )
    return case.context_length


@app.command()
def gate(
    sources: list[str] = typer.Argument(
        ...,
        metavar="SOURCE",
        callback=_check_source,
        help="Engine base URLs (http://host:port, whose /get_server_info is read) or saved "
        "server_info JSON files.",
        show_default=False,
    ),
    context_length: int | None = context_length_option(
        "The context the platform advertises for the model (default: each engine's own)."
    ),
    case_path: Path | None = typer.Option(
        None,
        "--case",
        metavar="CASE",
        help="Take the advertised context from a case manifest's [incident].context_length.",
        show_default=False,
    ),
    timeout: float = timeout_option(10.0, "each engine"),
    as_json: bool = JSON_OPT,
) -> None:
    """Before deploy: check engines against the advertised context.

    Per node: the input limit reaches context - 6 (prefill, unified), the decode pool holds
    it, roles, page size, chunked prefill and context agree across the fleet, and the engine
    release is not on the known-bad list. Exit 1 when any node fails or cannot be read.
    """
    if case_path is not None:
        if context_length is not None:
            raise typer.BadParameter(
                "give --context-length or --case, not both", param_hint="--case"
            )
        context_length = _case_context(case_path)
    _gate(sources, context_length, timeout, as_json)


@handle_errors
def _gate(sources: list[str], context_length: int | None, timeout: float, as_json: bool) -> None:
    from forensics.gate import gate as run_gate

    report = run_gate(sources, context_length, timeout=timeout)
    if as_json:
        import json

        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_gate(report)
    if not report.passed:
        raise typer.Exit(1)


def _print_gate(report: GateReport) -> None:
    from forensics.terminal import Col, Grid, make_console, plural, styled

    console = make_console()
    grid = Grid("", [Col("node"), Col("check"), Col("result"), Col("why", wrap=True)])
    for node in report.nodes:
        for check in node.checks:
            result = styled(("pass", "green")) if check.passed else styled(("FAIL", "bold red"))
            grid.add_row(node.source, check.name, result, check.why)
    grid.print(console)
    against = (
        f"advertised context {report.context_length:,}"
        if report.context_length
        else "each engine's own context length"
    )
    failed = report.failed()
    if failed:
        console.print(
            styled(
                ("Gate: FAIL", "bold red"),
                f": {len(failed)} of {plural(len(report.nodes), 'node')} failed ({against}): "
                + ", ".join(n.source for n in failed),
            )
        )
    else:
        console.print(
            styled(
                ("Gate: pass", "bold green"),
                f": all {plural(len(report.nodes), 'node')} passed ({against}).",
            )
        )
