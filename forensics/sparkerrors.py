"""Spark's failures as one line each: which statement or stage, and why.

Shared by detection on Spark (``forensics.spark``) and the evidence read in place
(``forensics.lake``). A JVM stack trace reaches the user only with ``--debug``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from forensics.errors import ForensicsError

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame


class SparkError(ForensicsError):
    """A Spark job or statement failed: one line saying which statement and why."""


@contextmanager
def one_line_failures(what: str) -> Iterator[None]:
    """A Spark job's failure inside the block raised as one line: its cause and ``what``."""
    try:
        yield
    except Exception as exc:
        if type(exc).__name__ not in ("Py4JJavaError", "PythonException") and not is_spark_error(
            exc
        ):
            raise
        line = error_line(exc)
        raise SparkError(f"{line} (in: {first_line(what)}){_driver_hint(line)}") from None


def _driver_hint(line: str) -> str:
    """What to change when the driver ran short: the setting, and the flag that sets it (the
    driver's settings are read when Spark starts, so a rerun takes them)."""
    if "spark.driver.maxResultSize" in line:
        return "; raise it with --spark-conf spark.driver.maxResultSize=4g"
    if "OutOfMemoryError" in line or "TaskResultLost" in line:
        return (
            "; the driver (in local mode, every task too) ran short of memory: give it more "
            "with --spark-conf spark.driver.memory=4g"
        )
    return ""


def to_arrow(df: DataFrame, what: str) -> pa.Table:
    """A result's rows, or the Spark job's failure as one line (its stage and cause)."""
    with one_line_failures(what):
        return df.toArrow()


# Rows per piece when a large result is copied back from Spark (``arrow_pieces``): tens of MB
# of Arrow. One task's result of hundreds of MB is what a driver of default size loses ("the
# result lost from block manager", seen at 16M requests copying 786,029 exposures back).
PIECE_ROWS = 100_000


def arrow_pieces(
    df: DataFrame, what: str, rows: int | None = None, *, materialised: bool = False
) -> Iterator[pa.Table]:
    """A result's rows as Arrow tables of about ``rows`` rows each, one Spark job per piece,
    so what one copy back asks of the driver is bounded whatever detection found.

    The frame is computed once (checkpointed, unless ``materialised`` says it already is, as a
    workspace table is), counted, then split by a hash of each whole row: pieces come in no
    particular order, so a caller that keeps an order sorts on insert. Identical rows fall in
    the same piece; every row is in exactly one.
    """
    import math

    from pyspark.sql import functions as F

    rows = rows or PIECE_ROWS
    with one_line_failures(what):
        frame = df if materialised else df.localCheckpoint(eager=True)
        total = frame.count()
    pieces = max(1, math.ceil(total / rows))
    if pieces == 1:
        yield to_arrow(frame, what)
        return
    piece = F.pmod(F.xxhash64(*[F.col(f"`{c}`") for c in frame.columns]), F.lit(pieces))
    for number in range(pieces):
        yield to_arrow(frame.where(piece == number), what)


def is_spark_error(exc: Exception) -> bool:
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException)


def first_line(sql: str) -> str:
    lines = [
        line.strip()
        for line in sql.splitlines()
        if line.strip() and not line.strip().startswith("--")
    ]
    text = " ".join(lines)
    return text if len(text) <= 120 else text[:117] + "..."


def error_line(exc: Exception) -> str:
    """The line of a Spark error that says what went wrong, without the JVM stack trace: the
    first line, or for a Python error in a task the exception it ends with."""
    import re

    text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not text:
        return type(exc).__name__
    if "Python worker" in text[0]:
        raised = [line for line in text if re.match(r"^[\w.]+(Error|Exception)\b.*:", line)]
        if raised:
            return f"Python error in a Spark task: {raised[-1]}"
    if text[0].startswith("An error occurred while calling"):
        # A JVM exception PySpark does not translate (a job aborted for the driver's result
        # size or memory, say): its first line names only the Py4J call that failed. The
        # innermost cause says why; the Java package adds nothing to it.
        causes = [line.removeprefix("Caused by:").strip() for line in text if "Caused by:" in line]
        thrown = text[1].lstrip(": ") if len(text) > 1 else text[0]
        reason = causes[-1] if causes else thrown
        return re.sub(r"^(?:[a-z_$][\w$]*\.)+(?=[A-Z])", "", reason)
    return text[0]
