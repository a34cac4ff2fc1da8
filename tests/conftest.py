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


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory) -> Path:
    """The tiny case run once by ``forensics run`` under the common umask 022: its manifest,
    with the outputs in report/ beside it. Shared: compare against it, never write into it."""
    import os

    from typer.testing import CliRunner

    from forensics.cli import app

    target = tmp_path_factory.mktemp("reference") / "tiny_case"
    shutil.copytree(FIXTURES / "tiny_case", target, ignore=shutil.ignore_patterns("*.duckdb*"))
    previous = os.umask(0o022)
    try:
        result = CliRunner().invoke(app, ["run", str(target / "case.toml")])
        # The command made its own files private and gave the umask back.
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.output
    return target / "case.toml"


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """The size of every batch of files ingest tried to load in one statement: positive when
    it loaded, negative when it was undone."""
    from forensics.ingest import batch

    seen: list[int] = []
    real = batch.load_batch

    def spy(con, batch, progress):
        loaded, alone = real(con, batch, progress)
        seen.append(len(batch) if loaded is not None else -len(batch))
        # Whether it loaded or was undone, the batch leaves no working table behind.
        assert con.execute(
            "SELECT list(table_name) FROM duckdb_tables() WHERE temporary"
        ).fetchone() == (None,)
        return loaded, alone

    monkeypatch.setattr(batch, "load_batch", spy)
    return seen
