"""The examples in docstrings run, and the README shows every command."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import forensics

MODULES = sorted(m.name for m in pkgutil.walk_packages(forensics.__path__, prefix="forensics."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_readme_shows_every_command():
    from forensics.cli import app

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        assert re.search(rf"forensics {name}\b", readme), f"README does not show `{name}`"
    assert "make demo" in readme and "make test" in readme
