"""Log coverage: per node and side, the span of the evidence, its gaps, and one-sided requests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

SQL_DIR = Path(__file__).resolve().parent / "sql"
GAP_SECONDS = 1800.0  # a node silent for 30 minutes is a hole worth stating


def assess(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> None:
    """Fill findings_coverage."""
    from forensics.detect import run_sql_file
    from forensics.schema import FINDINGS_DDL

    con.execute(FINDINGS_DDL["findings_coverage"])
    run_sql_file(con, SQL_DIR / "coverage.sql", {"gap_s": GAP_SECONDS})
