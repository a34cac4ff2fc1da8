"""The Typer application every command registers on, and what commands share: the case
argument, the memory option, and how errors reach the user.

Errors the user can act on print one line and exit 1; usage errors exit 2; ``--debug`` shows
tracebacks. Nothing here imports a command: ``forensics.cli`` brings them together.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from forensics import __version__
from forensics.errors import ForensicsError

app = typer.Typer(
    name="forensics",
    help="Incident forensics for cross-tenant KV cache exposure in LLM inference serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: flags read as flags (no type after them), choices are listed, and help
    # text that names a manifest table such as [database] is not taken for console markup.
    rich_markup_mode=None,
)

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"forensics {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    _state["debug"] = debug
    # Everything a command writes holds customer data, including files other code creates
    # (DuckDB's write-ahead log and spill files): no access for group or others. A stricter
    # umask is kept; the old one is restored when the command ends.
    old = os.umask(0o077)
    os.umask(old | 0o077)
    ctx.call_on_close(lambda: os.umask(old))


def check_memory_limit(value: str | None) -> str | None:
    """Validate ``--memory-limit`` while parsing options, so a bad size is a usage error."""
    if value is None:
        return None
    from forensics.case import check_memory_limit as check

    try:
        return check(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


CASE_ARG = typer.Argument(
    ..., metavar="CASE", help="The case folder or its case.toml.", show_default=False
)

MEMORY_OPT = typer.Option(
    None,
    "--memory-limit",
    metavar="SIZE",
    callback=check_memory_limit,
    help="Cap DuckDB's memory, e.g. 1GB (default: the manifest's [database].memory_limit, "
    "else 2GB, or 3GB for a case database of 3 GB or more); beyond it work spills to "
    "<database>.tmp/.",
)


def check_engine(value: str | None) -> str | None:
    """Validate ``--engine`` while parsing options (a usage error, exit 2)."""
    from forensics.case import ENGINES

    if value is not None and value not in ENGINES:
        raise typer.BadParameter(f"must be one of {', '.join(ENGINES)}")
    return value


def check_spark_conf(values: list[str] | None) -> list[str] | None:
    """Validate each ``--spark-conf KEY=VALUE`` while parsing options."""
    for item in values or []:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise typer.BadParameter(f"{item!r}: give a Spark setting as spark.key=value")
    return values


ENGINE_OPT = typer.Option(
    None,
    "--engine",
    metavar="NAME",
    callback=check_engine,
    help="Where detection runs: duckdb or spark (default: the manifest's [engine].name, "
    "else duckdb).",
)
SPARK_MASTER_OPT = typer.Option(
    None,
    "--spark-master",
    metavar="URL",
    help="The Spark master, e.g. local[2] or spark://host:7077 (default: [engine].master, "
    "else local[*]).",
)
SPARK_CONF_OPT = typer.Option(
    None,
    "--spark-conf",
    metavar="KEY=VALUE",
    callback=check_spark_conf,
    help="A Spark setting (repeatable), over the manifest's [engine].conf.",
)
IN_PLACE_OPT = typer.Option(
    False,
    "--in-place",
    help="Spark reads every evidence file where it lies (local paths or s3a://, gs://, "
    'abfss:// URIs) instead of the case database ([engine] evidence = "in-place").',
)


def with_engine(
    case: Any,
    engine: str | None,
    master: str | None,
    conf: list[str] | None,
    in_place: bool = False,
):
    """The case with the engine options of the command line over its manifest's.

    Raises:
        typer.BadParameter: evidence read in place with an engine other than Spark.
    """
    from dataclasses import replace

    from forensics.case import IN_PLACE

    if engine is None and master is None and not conf and not in_place:
        return case
    name = engine or case.engine.name
    evidence = IN_PLACE if in_place else case.engine.evidence
    if evidence == IN_PLACE and name != "spark":
        where = "--in-place" if in_place else '[engine] evidence = "in-place"'
        raise typer.BadParameter(f"{where} is read by Spark: add --engine spark")
    settings = dict(case.engine.conf)
    for item in conf or []:  # checked while parsing (check_spark_conf)
        key, _, value = item.partition("=")
        settings[key.strip()] = value.strip()
    chosen = replace(
        case.engine,
        name=name,
        master=master or case.engine.master,
        conf=settings,
        evidence=evidence,
    )
    return replace(case, engine=chosen)


# The base of typer.BadParameter: a usage error, which the command line prints with its usage
# line and exit code 2 wherever it is raised.
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one red line and exit code 1 (``--debug`` re-raises)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit, _UsageError):
            # A usage error found after parsing (options that contradict the manifest) is
            # still one: click prints it with the usage line and exits 2.
            raise
        except ForensicsError as exc:
            if _state["debug"]:
                raise
            error(str(exc))
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.secho("Interrupted.", err=True, fg="red")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - last line of defence: no traceback for users
            if _state["debug"]:
                raise
            if isinstance(exc, RuntimeError) and str(exc).startswith("Query interrupted"):
                # Ctrl-C while DuckDB runs a query reaches Python as this, not as
                # KeyboardInterrupt: it is the user stopping the command, not an error.
                typer.secho("Interrupted.", err=True, fg="red")
                raise typer.Exit(130) from None
            duckdb = sys.modules.get("duckdb")
            if duckdb is not None and isinstance(exc, duckdb.OutOfMemoryException):
                from forensics.db import memory_error

                message = str(memory_error(exc))
            else:
                # One line, whatever the exception says (DuckDB's messages can run on).
                lines = str(exc).strip().splitlines()
                message = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
                message += " (run with --debug for details)"
            error(message)
            raise typer.Exit(1) from None

    return wrapper


def error(message: str) -> None:
    """One red ``Error:`` line on stderr; what the evidence put in the message is shown, never
    obeyed (a newline or an escape sequence in a file name stays visible and harmless)."""
    from forensics.terminal import clean

    typer.secho(f"Error: {clean(message)}", err=True, fg="red")
