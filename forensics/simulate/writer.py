"""Write a simulated case: canonical evidence files, ``case.toml`` and the ground truth.

Formats differ on purpose so ingest breadth is exercised: requests as gzipped JSON Lines (one
file per UTC day), engine legs and KV allocations as Parquet with typed UTC timestamps, pool
snapshots and tenants as CSV. Every writer is byte-deterministic: rows are sorted with a total
order, gzip headers carry no name and mtime 0, and nothing reads the clock.
"""

from __future__ import annotations

import gzip
import io
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.schema import columns

if TYPE_CHECKING:
    import polars as pl

TS_FORMAT = "%Y-%m-%dT%H:%M:%S%.6fZ"

# What a previous simulation wrote into a folder; cleared before writing a new one so a glob
# never picks up a stale day file.
OWN_PATTERNS = (
    "evidence/requests-*.jsonl.gz",
    "evidence/engine_legs-*.parquet",
    "evidence/pool_snapshots.csv",
    "evidence/tenants.csv",
    "evidence/kv_allocations.parquet",
    "truth/affected.csv",
    "truth/exposures.csv",
    "truth/summary.json",
    "truth/tenants.csv",
    "truth/sessions.csv",
    "truth/probes.csv",
    "case.toml",
    # The same evidence in the formats of a real serving stack (forensics.simulate.formats).
    "evidence/sglang/*.log.gz",
    "evidence/server_info/*.json",
    "evidence/otel/traces-*.jsonl.gz",
    "evidence/litellm/spend_logs-*.csv.gz",
)


def rfc3339(dt: datetime) -> str:
    """A UTC datetime as ``YYYY-MM-DDTHH:MM:SSZ`` (seconds precision, for the manifest)."""
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_us(col: str) -> pl.Expr:
    """An integer-µs column as an RFC 3339 string with microseconds and ``Z``."""
    import polars as pl

    return pl.from_epoch(pl.col(col), time_unit="us").dt.strftime(TS_FORMAT).alias(col)


def ts_us(col: str) -> pl.Expr:
    """An integer-µs column as a UTC timestamp (Parquet keeps it typed)."""
    import polars as pl

    return pl.from_epoch(pl.col(col), time_unit="us").dt.replace_time_zone("UTC").alias(col)


def canonical_order(df: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Select the kind's canonical columns in schema order (every one must be present)."""
    return df.select([c.name for c in columns(kind)])


def clear_previous(out: Path) -> None:
    """Remove files a previous simulation wrote here (and nothing else)."""
    for pattern in OWN_PATTERNS:
        for p in sorted(out.glob(pattern)):
            p.unlink()


def _gzip_bytes(data: bytes) -> bytes:
    # Level 3: within ~15% of level 6's size at a third of the time (1M requests).
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=3) as gz:
        gz.write(data)
    return buf.getvalue()


def write_requests(out: Path, df: pl.DataFrame) -> list[Path]:
    """Requests as ``evidence/requests-YYYY-MM-DD.jsonl.gz``, one file per UTC arrival day."""
    import polars as pl

    df = df.sort(["received_at", "request_id"])
    day = pl.from_epoch(pl.col("received_at"), time_unit="us").dt.strftime("%Y-%m-%d")
    df = df.with_columns(day.alias("_day"))
    ts_cols = ["received_at", "first_token_at", "completed_at"]
    text = df.with_columns([iso_us(c) for c in ts_cols])
    parts = []
    for (d,), part in sorted(text.partition_by("_day", as_dict=True, maintain_order=True).items()):
        part = canonical_order(part, "requests")
        parts.append((out / "evidence" / f"requests-{d}.jsonl.gz", part.write_ndjson().encode()))
    # zlib releases the GIL, so the day files compress in parallel.
    with ThreadPoolExecutor(max_workers=4) as pool:
        blobs = list(pool.map(_gzip_bytes, [p[1] for p in parts]))
    for (path, _), blob in zip(parts, blobs, strict=True):
        path.write_bytes(blob)
    return [p for p, _ in parts]


def write_parquet(path: Path, df: pl.DataFrame, kind: str, ts_cols: list[str]) -> Path:
    """One canonical Parquet file with typed UTC timestamps."""
    canonical_order(df.with_columns([ts_us(c) for c in ts_cols]), kind).write_parquet(
        path, compression="zstd", statistics=False
    )
    return path


def write_csv(path: Path, df: pl.DataFrame, ts_cols: list[str]) -> Path:
    """A CSV with a header; timestamps as RFC 3339 strings."""
    df.with_columns([iso_us(c) for c in ts_cols]).write_csv(path)
    return path


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def case_toml(
    *,
    case_id: str,
    title: str,
    model: str,
    start: datetime,
    end: datetime,
    as_of: datetime,
    context_length: int,
    evidence: list[tuple],
    exclusions: list[dict],
    timeline: list[tuple[datetime, str, bool]],
) -> str:
    """The case manifest text (the manifest the README describes)."""
    lines = [
        "# Generated by `forensics simulate`: a synthetic case with known ground truth (truth/).",
        "",
        "[incident]",
        f"id = {_toml_str(case_id)}",
        f"title = {_toml_str(title)}",
        f"model = {_toml_str(model)}",
        f"start = {_toml_str(rfc3339(start))}",
        f"end = {_toml_str(rfc3339(end))}",
        f"context_length = {context_length}",
        'timezone = "UTC"',
        f"as_of = {_toml_str(rfc3339(as_of))}",
        "",
        "[database]",
        'path = "case.duckdb"',
        "",
    ]
    for kind, fmt, paths, *more in evidence:
        lines += [
            "[[evidence]]",
            f"kind = {_toml_str(kind)}",
            f"format = {_toml_str(fmt)}",
            f"paths = {_toml_list(paths)}",
        ]
        # What a file of a real format does not say itself: its node, role, time.
        lines += [f"{k} = {_toml_str(v)}" for k, v in (more[0] if more else {}).items()]
        lines.append("")
    lines += [
        "[detection]",
        "default_pool_tokens = 681280",
        "latency_factor = 0.2",
        'overlap_window = "15m"',
        "",
    ]
    for ex in exclusions:
        lines += [
            "[[exclusion]]",
            f"name = {_toml_str(ex['name'])}",
            f"reason = {_toml_str(ex['reason'])}",
        ]
        for key in ("tenant_ids", "api_key_ids", "client_cidrs"):
            if ex.get(key):
                lines.append(f"{key} = {_toml_list(ex[key])}")
        if ex.get("user_agent_regex"):
            lines.append(f"user_agent_regex = {_toml_str(ex['user_agent_regex'])}")
        lines.append("")
    for at, event, fix in sorted(timeline):
        lines += ["[[timeline]]", f"at = {_toml_str(rfc3339(at))}", f"event = {_toml_str(event)}"]
        # The event that removed the cause: notices and the summary say when it was fixed.
        lines += ["fix = true", ""] if fix else [""]
    return "\n".join(lines)


def as_of_for(end: datetime) -> datetime:
    """The report's fixed generation instant: one day after the simulated span."""
    return end + timedelta(days=1)
