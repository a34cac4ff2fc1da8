"""``forensics simulate``: write a complete synthetic case (manifest, evidence, ground truth)."""

from __future__ import annotations

from pathlib import Path

import typer

from forensics.cli import app, handle_errors

_FORMATS = ("canonical",)


def _check_format(value: str) -> str:
    # Validated while parsing (not inside the command) so a bad value is a usage error: exit 2.
    if value not in _FORMATS:
        raise typer.BadParameter(
            f"{value!r} is not supported; choose one of: {', '.join(_FORMATS)}"
        )
    return value


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
    out_dir: Path = typer.Argument(..., help="Case folder to write (created if missing)."),
    requests: int = typer.Option(
        30_000, "--requests", "-n", min=200, help="Client requests to simulate."
    ),
    seed: int = typer.Option(0, "--seed", "-s", help="Random seed: same seed, same bytes."),
    fmt: str = typer.Option(
        "canonical", "--format", "-f", callback=_check_format, help="Evidence format (canonical)."
    ),
    kv_allocations: bool = typer.Option(
        False,
        "--kv-allocations/--no-kv-allocations",
        help="Also write the decode allocator log (exact attribution evidence).",
    ),
    probers: str = typer.Option(
        "",
        "--probers",
        callback=_check_probers,
        help="Customer tenants probing the limit on purpose, comma-separated: "
        "binary_search, sweep, repeat, slow (default: none).",
    ),
) -> None:
    """Write a synthetic incident case: case.toml, evidence/ and truth/."""
    from forensics.simulate import simulate_case

    s = simulate_case(
        out_dir,
        requests=requests,
        seed=seed,
        fmt=fmt,
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
