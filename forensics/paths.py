"""Where the SQL detectors (``queries/``) and report templates (``reports/``) live.

In a source checkout they sit at the top of the repository; in an installed wheel they are
shipped inside the package as ``forensics/_data/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"the {name}/ folder is missing from this installation")


def queries_dir() -> Path:
    """The folder of SQL detectors and their metadata."""
    return _data_dir("queries")


def reports_dir() -> Path:
    """The folder of Jinja2 report templates."""
    return _data_dir("reports")
