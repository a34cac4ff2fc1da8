"""``forensics simulate``: write a complete synthetic case (manifest, evidence, ground truth)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from forensics.app import app, handle_errors
from forensics.simulate import FORMATS

# The formats the simulator writes: anything else is a usage error that lists them.
# Choices built from the data they list; mypy cannot see members of an enum made this way.
SimFormat = StrEnum("SimFormat", {f: f for f in FORMATS})  # type: ignore[misc]
DEFAULT_SIMFORMAT = SimFormat("canonical")


def _check_probers(value: str) -> str:
    # Same rule as the library (make_config), reported as a usage error: exit 2.
    from forensics.simulate.config import parse_probers

    try:
        return ",".join(parse_probers(value))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


@app.command()
@handle_errors
def simulate(
    out_dir: Path = typer.Argument(
        ..., metavar="DIR", help="Case folder to write (created if missing).", show_default=False
    ),
    requests: int = typer.Option(
        30_000, "--requests", "-n", metavar="N", min=200, help="Client requests to simulate."
    ),
    seed: int = typer.Option(
        0, "--seed", "-s", metavar="N", help="Random seed: same seed, same bytes."
    ),
    fmt: SimFormat = typer.Option(DEFAULT_SIMFORMAT, "--format", "-f", help="Evidence format."),
    kv_allocations: bool = typer.Option(
        False,
        "--kv-allocations/--no-kv-allocations",
        help="Also write the decode allocator log (exact attribution evidence).",
    ),
    probers: str = typer.Option(
        "",
        "--probers",
        metavar="LIST",
        callback=_check_probers,
        help="Customer tenants probing the limit on purpose, comma-separated: "
        "binary_search, sweep, repeat, slow (default: none).",
        show_default=False,
    ),
) -> None:
    """Write a synthetic case: case.toml, evidence/ and truth/."""
    import importlib.util

    from forensics.errors import ForensicsError
    from forensics.simulate import simulate_case

    # The simulator is the one part that needs polars; an install for investigations only
    # does without it.
    if importlib.util.find_spec("polars") is None:
        raise ForensicsError('the simulator needs polars: pip install "kv-forensics[simulate]"')

    s = simulate_case(
        out_dir,
        requests=requests,
        seed=seed,
        fmt=fmt.value,
        kv_allocations=kv_allocations,
        probers=probers,
    )
    files = ", ".join(f"{count} {ext}" for ext, count in s.files.items())
    typer.echo(f"Wrote {s.case_path} ({files})")
    typer.echo(
        f"{s.requests:,} requests; {s.affected} affected ({s.affected_excluded} excluded); "
        f"{s.exposures:,} exposures; to notify, as the report counts them: "
        f"{s.recipient_tenants} recipient tenants, {s.source_tenants} source tenants"
    )
    if s.probers:
        typer.echo(
            "Probers: "
            + ", ".join(f"{name} {count:,} requests" for name, count in s.probers.items())
        )
    typer.echo(f"Next: forensics run {s.case_path}")
