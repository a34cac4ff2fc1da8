"""Shared fixtures: keep this small and generic."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def tiny_case_dir(tmp_path: Path) -> Path:
    """A private copy of tests/fixtures/tiny_case (its database is created inside the copy)."""
    target = tmp_path / "tiny_case"
    shutil.copytree(FIXTURES / "tiny_case", target, ignore=shutil.ignore_patterns("*.duckdb*"))
    return target


@pytest.fixture
def memory_db():
    """An empty in-memory case database with every canonical table."""
    from forensics.db import connect

    con = connect(":memory:")
    yield con
    con.close()
