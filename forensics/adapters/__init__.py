"""Format adapters: what a serving stack really writes, mapped onto the canonical tables.

An adapter does not load anything itself. It presents one file to canonical ingest as a
:class:`~forensics.readers.Source` whose columns are the canonical columns, each an SQL
expression over the file's records; :mod:`forensics.casts` then types, bounds-checks and
rejects them exactly as it does canonical files. So every record is loaded or rejected with a
reason (a line the format does not describe is rejected, saying what it is), unmapped fields
land in ``extra``, and the work stays in DuckDB, set-based.

Adding a format: a module here with ``KINDS`` (the canonical kinds it maps), ``TENANT_KINDS``
(the kinds whose tenant ``tenant_field`` names), ``open_source`` and ``sniff``; then an entry
in ``ADAPTERS``. docs/architecture.md walks through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.errors import EvidenceError

if TYPE_CHECKING:
    import duckdb

    from forensics.readers import ByteProgress, Source

# Format name -> module of forensics.adapters. Canonical files are read by forensics.readers.
ADAPTERS = {"sglang": "sglang", "otel": "otel", "litellm": "litellm", "cloudflare": "cloudflare"}
# How much of a file ``auto`` looks at: enough for a pretty-printed document's first keys.
SNIFF_BYTES = 64 << 10


@dataclass(frozen=True)
class Options:
    """What an [[evidence]] entry (or the command line) says about files that do not say it.

    ``node``, ``role`` and ``observed_at`` fill the columns of the same name where a record
    has none; ``tenant_field`` names the field, attribute or label holding the tenant (each
    format has a documented default).
    """

    node: str | None = None
    role: str | None = None
    observed_at: datetime | None = None
    tenant_field: str | None = None


def _module(fmt: str):
    return import_module(f"forensics.adapters.{ADAPTERS[fmt]}")


def kinds(fmt: str) -> tuple[str, ...]:
    """The canonical kinds a format maps onto (every kind for ``canonical`` and ``auto``).

    >>> kinds("otel")
    ('requests',)
    """
    from forensics.schema import KINDS

    return _module(fmt).KINDS if fmt in ADAPTERS else KINDS


def check_entry(fmt: str, kind: str, tenant_field: str | None) -> str | None:
    """Why an evidence entry of this format, kind and tenant_field cannot be read, or None.

    A ``tenant_field`` that a format and kind would not use is refused rather than ignored.

    >>> check_entry("otel", "engine_legs", None)
    "format 'otel' maps onto requests, not engine_legs"
    >>> check_entry("canonical", "pool_snapshots", "owner")
    'tenant_field applies to requests only with format canonical'
    """
    if kind not in kinds(fmt):
        return f"format {fmt!r} maps onto {', '.join(kinds(fmt))}, not {kind}"
    if tenant_field is None or fmt == "auto":
        return None
    usable = _module(fmt).TENANT_KINDS if fmt in ADAPTERS else ("requests",)
    if kind not in usable:
        return f"tenant_field applies to {', '.join(usable)} only with format {fmt}"
    return None


def compression(path: Path) -> str | None:
    """The compression a file name says (``.gz``, ``.zst``), else None."""
    from forensics.readers import COMPRESSIONS

    return COMPRESSIONS.get(path.suffix.lower())


def head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` decompressed bytes of a file (fewer for a short or damaged one)."""
    import pyarrow as pa

    from forensics.readers import _stream

    try:
        stream, _ = _stream(path, compression(path))
    except (OSError, pa.ArrowException) as exc:
        raise EvidenceError(f"cannot read the file ({exc})") from None
    try:
        return stream.read(size)
    except (OSError, pa.ArrowException):
        return b""  # a damaged start: nothing to judge the format by
    finally:
        stream.close()


def sniff(path: Path) -> tuple[str, str]:
    """The format of a file from its first bytes, and what gave it away.

    Raises:
        EvidenceError: the file is missing, or its start fits no format we read.
    """
    if not path.is_file():
        raise EvidenceError("file not found")
    data = head(path)
    if data.startswith(b"PAR1"):
        return "canonical", "a Parquet file"
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    for fmt in ADAPTERS:
        why = _module(fmt).sniff(text)
        if why:
            return fmt, why
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith(("{", "[")) or "," in first:
        return "canonical", "JSON or CSV records of no other format"
    raise EvidenceError(
        "cannot tell the format from the first lines (not canonical JSON Lines, CSV or "
        f"Parquet, nor {', '.join(ADAPTERS)}): give format in the [[evidence]] entry"
    )


def open_source(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    kind: str,
    fmt: str,
    tag: str,
    progress: ByteProgress | None,
    options: Options,
) -> Source:
    """One file of an adapter format as a source of canonical ``kind`` columns.

    Raises:
        EvidenceError: the file cannot be read in this format at all (the message says why).
    """
    problem = check_entry(fmt, kind, options.tenant_field)
    if problem:
        raise EvidenceError(problem)
    if not path.is_file():
        raise EvidenceError("file not found")
    return _module(fmt).open_source(con, path, kind, tag, progress, options)
