"""The ``forensics`` command line: thin commands over the library.

Each command (one module per noun in ``forensics/commands/``) validates its options, makes one
library call and renders the result. Importing this module registers them all, once, on
``forensics.app.app``, in the order a responder uses them.
"""

from __future__ import annotations

from typing import Any

from forensics.app import app
from forensics.commands import (  # noqa: F401 - importing a command module registers it
    canary,
    detect,
    gate,
    ingest,
    report,
    simulate,
    sql,
)

__all__ = ["app", "main"]

# Help lists the commands in the order a responder uses them: the main job first.
ORDER = (
    *("run", "ingest", "status", "detect", "explain", "report", "sql", "simulate"),
    *("gate", "canary"),  # then prevention: before deploy, every hour
)


def _place(command: Any) -> int:
    name = command.name or command.callback.__name__
    return ORDER.index(name) if name in ORDER else len(ORDER)


app.registered_commands.sort(key=_place)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="forensics")


if __name__ == "__main__":  # pragma: no cover
    main()
