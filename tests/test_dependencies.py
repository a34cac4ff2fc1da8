"""Each dependency where it is used: polars only for the simulator, heavy libraries only when
a command needs them."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from forensics.cli import app


def test_simulate_without_polars_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "polars" else real(name, *a)
    )
    result = CliRunner().invoke(app, ["simulate", str(tmp_path / "sim")])
    assert result.exit_code == 1
    assert 'the simulator needs polars: pip install "kv-forensics[simulate]"' in result.output
    assert not (tmp_path / "sim").exists()


def test_the_command_line_loads_without_the_heavy_libraries():
    code = (
        "import sys, forensics.cli\n"
        "heavy = {'duckdb', 'polars', 'pyarrow', 'numpy', 'altair', 'jinja2', 'sqlglot', 'pyspark'}"
        " & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
