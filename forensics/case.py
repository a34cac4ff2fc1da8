"""The case manifest (``case.toml``): load, validate, resolve paths.

A manifest error is one line naming the key, e.g. ``case.toml: [detection].latency_factor: must
be a number between 0 and 1, got 'fast'``.
"""

from __future__ import annotations

import glob
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forensics.errors import ManifestError
from forensics.schema import KINDS

FORMATS = ("canonical", "sglang", "otel", "litellm", "helicone", "cloudflare", "auto")
ROLES = ("prefill", "decode", "unified")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """Parse ``"15m"``, ``"90s"``, ``"1.5h"``, ``"250ms"`` or ``"2d"``.

    >>> parse_duration("15m")
    datetime.timedelta(seconds=900)
    """
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration like '15m' or '90s': {text!r}")
    return timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])


_SIZE = re.compile(r"\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B|B)\s*", re.IGNORECASE)


def check_memory_limit(value: str) -> str:
    """The memory limit as DuckDB takes it; ValueError when it is no size.

    >>> check_memory_limit(" 1GB ")
    '1GB'
    """
    if not isinstance(value, str) or not _SIZE.fullmatch(value):
        raise ValueError(f"not a memory size such as '1GB' or '512MB': {value!r}")
    return value.strip()


def memory_bytes(value: str) -> int:
    """A memory size in bytes, in DuckDB's units: KB, MB, GB, TB are powers of 1000, KiB, MiB,
    GiB, TiB powers of 1024.

    >>> memory_bytes("2GB"), memory_bytes("1.5 GiB")
    (2000000000, 1610612736)
    """
    size = check_memory_limit(value).upper().replace(" ", "")
    number, unit = re.fullmatch(r"([0-9.]+)([KMGT]?I?B)", size).groups()  # type: ignore[union-attr]
    base = 1024 if "I" in unit else 1000
    return int(float(number) * base ** "BKMGT".index(unit[0]))


def parse_instant(value: Any, tz: str = "UTC") -> datetime:
    """An RFC 3339 string or TOML datetime as an aware UTC datetime; naive means ``tz``.

    >>> parse_instant("2026-09-08T14:02:00Z").isoformat()
    '2026-09-08T14:02:00+00:00'
    >>> parse_instant("2026-09-08 16:02:00", "Europe/Rome").isoformat()
    '2026-09-08T14:02:00+00:00'
    """
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        dt = datetime.fromisoformat(text)
    else:
        raise ValueError(f"not a timestamp: {value!r}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=ZoneInfo(tz))
    return dt.astimezone(UTC)


@dataclass(frozen=True)
class Evidence:
    kind: str
    format: str
    paths: tuple[str, ...]  # patterns as written, resolved against the manifest folder
    node: str | None = None
    role: str | None = None
    observed_at: datetime | None = None
    tenant_field: str | None = None

    def files(self) -> list[Path]:
        """The files the patterns match, sorted, each once."""
        found: list[Path] = []
        for pattern in self.paths:
            matches = sorted(glob.glob(pattern, recursive=True))
            if not matches and not glob.has_magic(pattern):
                matches = [pattern]  # a plain missing path: let ingest report it by name
            found += [Path(m) for m in matches]
        return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Exclusion:
    name: str
    reason: str = ""
    tenant_ids: tuple[str, ...] = ()
    api_key_ids: tuple[str, ...] = ()
    client_cidrs: tuple[str, ...] = ()
    user_agent_regex: str | None = None
    start: datetime | None = None
    end: datetime | None = None


@dataclass(frozen=True)
class TimelineEvent:
    at: datetime
    event: str
    # This event removed the cause (e.g. the engine patch); notices and the summary say when.
    fix: bool = False


@dataclass(frozen=True)
class Detection:
    default_pool_tokens: int | None = None
    overlap_window: timedelta = timedelta(minutes=15)
    default_page_size: int = 1
    # Tunables the manifest sets (forensics.parameters): name -> value, checked on load.
    overrides: dict[str, Any] = field(default_factory=dict)


ENGINES = ("duckdb", "spark")
IN_PLACE = "in-place"
EVIDENCE_READS = ("database", IN_PLACE)
# A pattern that names a file system by its scheme (s3a://, gs://, abfss://, hdfs://, file://)
# is read where it lies, by Spark; it is kept as written, not resolved against the manifest.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(pattern: str) -> bool:
    """Whether an evidence pattern is a URI (read in place by Spark), not a local path.

    >>> is_uri("s3a://logs/requests-*.parquet"), is_uri("evidence/*.jsonl"), is_uri("C:/x")
    (True, False, False)
    """
    return bool(_URI.match(pattern))


@dataclass(frozen=True)
class Engine:
    """Where detection runs (the manifest's ``[engine]``): DuckDB in this process, or Spark.

    Attributes:
        name: ``duckdb`` (the default and the reference) or ``spark``.
        master: the Spark master (``local[2]``, ``spark://host:7077``, ``yarn``, ``k8s://...``).
        conf: Spark settings, each ``spark.*`` key with its value as text.
        staging: where the evidence tables are written as Parquet for Spark to read: a folder
            every executor can read (default: ``<database>.spark/`` beside the database).
        evidence: ``database`` (ingest loads the evidence into the case database, Spark reads
            a staged copy) or ``in-place`` (Spark reads every [[evidence]] file where it lies,
            and the case database keeps only what the report reads: :mod:`forensics.lake`).
    """

    name: str = "duckdb"
    master: str = "local[*]"
    conf: dict[str, str] = field(default_factory=dict)
    staging: str | None = None
    evidence: str = "database"

    @property
    def in_place(self) -> bool:
        return self.evidence == IN_PLACE


def conf_value(value: Any) -> str:
    """A Spark setting's value as Spark reads it.

    >>> conf_value(True), conf_value(8), conf_value("4g")
    ('true', '8', '4g')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class Case:
    path: Path
    id: str
    title: str
    start: datetime | None
    end: datetime | None
    context_length: int | None
    timezone: str
    model: str | None
    as_of: datetime | None
    database: Path
    evidence: tuple[Evidence, ...]
    detection: Detection
    exclusions: tuple[Exclusion, ...]
    timeline: tuple[TimelineEvent, ...]
    # DuckDB's memory cap for this case ("1GB"); None leaves db.DEFAULT_MEMORY_LIMIT.
    memory_limit: str | None = None
    engine: Engine = field(default_factory=Engine)

    @property
    def folder(self) -> Path:
        return self.path.parent


class _Reader:
    """Reads one table of the manifest and names the exact key when something is wrong."""

    def __init__(self, file: Path, where: str, table: Any):
        self.file, self.where = file, where
        if not isinstance(table, dict):
            self.fail(None, "must be a table")
        self.table = table

    def fail(self, key: str | None, msg: str) -> None:
        name = f"{self.where}.{key}" if key else self.where
        raise ManifestError(f"{self.file.name}: {name}: {msg}")

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.table:
            if key not in allowed:
                self.fail(key, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def get(self, key: str, kind: type | tuple, default: Any = None, required: bool = False):
        if key not in self.table:
            if required:
                self.fail(key, "is required")
            return default
        value = self.table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind is not bool:
            self.fail(key, f"must be {_kind_name(kind)}, got {value!r}")
        if not isinstance(value, kind):
            self.fail(key, f"must be {_kind_name(kind)}, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.table.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, f"must be a list of strings, got {value!r}")
        return tuple(value)

    def instant(self, key: str, tz: str, required: bool = False) -> datetime | None:
        if key not in self.table:
            if required:
                self.fail(key, "is required")
            return None
        try:
            return parse_instant(self.table[key], tz)
        except (ValueError, TypeError) as exc:
            self.fail(key, f"must be an RFC 3339 timestamp ({exc})")
        return None


def _kind_name(kind: type | tuple) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "a list",
        dict: "a table",
    }
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def load_case(path: str | Path) -> Case:
    """Load and validate a case manifest; paths are resolved relative to its folder.

    ``path`` may be the manifest or the case folder holding it as ``case.toml``.

    Raises:
        ManifestError: the file is missing, not TOML, or a key is wrong (the message names it).
    """
    path = Path(path).resolve()
    if path.is_dir():
        if not (path / "case.toml").is_file():
            raise ManifestError(f"{path}: a folder with no case.toml in it")
        path = path / "case.toml"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{path}: case manifest not found") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the case manifest: {exc}") from None
    if data[8:12] == b"DUCK":
        raise ManifestError(
            f"{path}: a DuckDB database, not a case manifest: give the case folder or its "
            "case.toml (whose [database] names the database)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: cannot read the case manifest: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path.name}: not valid TOML: {exc}") from None

    top = _Reader(path, "case", raw)
    top.check_keys(
        {"incident", "database", "engine", "evidence", "detection", "exclusion", "timeline"}
    )

    inc = _Reader(path, "[incident]", raw.get("incident", None))
    inc.check_keys({"id", "title", "model", "start", "end", "context_length", "timezone", "as_of"})
    tz = inc.get("timezone", str, "UTC")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        inc.fail("timezone", f"unknown time zone {tz!r}")
    start, end = inc.instant("start", tz), inc.instant("end", tz)
    if start and end and end <= start:
        inc.fail("end", "must be after [incident].start")
    context_length = inc.get("context_length", int)
    if context_length is not None and context_length <= 0:
        inc.fail("context_length", "must be positive")

    db = _Reader(path, "[database]", raw.get("database", {}))
    db.check_keys({"path", "memory_limit"})
    database = path.parent / db.get("path", str, "case.duckdb")
    memory_limit = db.get("memory_limit", str)
    if memory_limit is not None:
        try:
            memory_limit = check_memory_limit(memory_limit)
        except ValueError as exc:
            db.fail("memory_limit", str(exc))

    engine = _engine(path, raw.get("engine", {}))
    evidence = tuple(_evidence(path, i, item, tz) for i, item in enumerate(_array(top, "evidence")))
    detection = _detection(path, raw.get("detection", {}))
    exclusions = tuple(
        _exclusion(path, i, item, tz) for i, item in enumerate(_array(top, "exclusion"))
    )
    names = [e.name for e in exclusions]
    for n in names:
        if names.count(n) > 1:
            raise ManifestError(f"{path.name}: [[exclusion]].name: duplicate name {n!r}")
    timeline = []
    for i, item in enumerate(_array(top, "timeline")):
        r = _Reader(path, f"[[timeline]] #{i + 1}", item)
        r.check_keys({"at", "event", "fix"})
        at = r.instant("at", tz, required=True)
        assert at is not None  # required: instant() has failed otherwise
        timeline.append(
            TimelineEvent(
                at,
                r.get("event", str, required=True),
                bool(r.get("fix", bool, False)),
            )
        )

    return Case(
        path=path,
        id=inc.get("id", str, required=True),
        title=inc.get("title", str, ""),
        start=start,
        end=end,
        context_length=context_length,
        timezone=tz,
        model=inc.get("model", str),
        as_of=inc.instant("as_of", tz),
        database=database,
        evidence=evidence,
        detection=detection,
        exclusions=exclusions,
        timeline=tuple(sorted(timeline, key=lambda t: t.at)),
        memory_limit=memory_limit,
        engine=engine,
    )


def _engine(path: Path, table: Any) -> Engine:
    r = _Reader(path, "[engine]", table)
    r.check_keys({"name", "master", "conf", "staging", "evidence"})
    name = r.get("name", str, "duckdb")
    if name not in ENGINES:
        r.fail("name", f"must be one of {', '.join(ENGINES)}, got {name!r}")
    evidence = r.get("evidence", str, "database")
    if evidence not in EVIDENCE_READS:
        r.fail("evidence", f"must be one of {', '.join(EVIDENCE_READS)}, got {evidence!r}")
    if evidence == IN_PLACE and name != "spark":
        r.fail("evidence", 'in-place is read by Spark: it needs name = "spark"')
    conf = r.get("conf", dict, {})
    for key, value in conf.items():
        if not key.startswith("spark."):
            r.fail(f"conf.{key}", "is not a Spark setting (those start with spark.)")
        if not isinstance(value, str | int | float | bool):
            r.fail(f"conf.{key}", f"must be a string, number or boolean, got {value!r}")
    return Engine(
        name=name,
        master=r.get("master", str, Engine.master),
        conf={key: conf_value(value) for key, value in conf.items()},
        staging=r.get("staging", str),
        evidence=evidence,
    )


def _array(top: _Reader, key: str) -> list:
    value = top.table.get(key, [])
    if not isinstance(value, list):
        top.fail(f"[[{key}]]", "must be an array of tables ([[" + key + "]])")
    return value


def _evidence(path: Path, i: int, item: Any, tz: str) -> Evidence:
    r = _Reader(path, f"[[evidence]] #{i + 1}", item)
    r.check_keys({"kind", "format", "paths", "node", "role", "observed_at", "tenant_field"})
    kind = r.get("kind", str, required=True)
    if kind not in KINDS:
        r.fail("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    fmt = r.get("format", str, "canonical")
    if fmt not in FORMATS:
        r.fail("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    patterns = r.strings("paths")
    if not patterns:
        r.fail("paths", "is required (a list of file paths or globs)")
    role = r.get("role", str)
    if role is not None and role not in ROLES:
        r.fail("role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    from forensics.adapters import check_entry

    tenant_field = r.get("tenant_field", str)
    problem = check_entry(fmt, kind, tenant_field)
    if problem:
        # Nothing in an entry is accepted and then ignored.
        r.fail("tenant_field" if "tenant_field" in problem else "format", problem)
    return Evidence(
        kind=kind,
        format=fmt,
        paths=tuple(p if is_uri(p) else str(path.parent / p) for p in patterns),
        node=r.get("node", str),
        role=role,
        observed_at=r.instant("observed_at", tz),
        tenant_field=tenant_field,
    )


def _detection(path: Path, item: Any) -> Detection:
    from forensics.parameters import tunable_parameters

    r = _Reader(path, "[detection]", item)
    tunables = tunable_parameters()
    r.check_keys({"default_pool_tokens", "overlap_window", "default_page_size"} | set(tunables))
    pool = r.get("default_pool_tokens", int)
    if pool is not None and pool <= 0:
        r.fail("default_pool_tokens", "must be positive")
    window_text = r.get("overlap_window", str, "15m")
    try:
        window = parse_duration(window_text)
    except ValueError as exc:
        r.fail("overlap_window", str(exc))
    page = r.get("default_page_size", int, 1)
    if page <= 0:
        r.fail("default_page_size", "must be positive")
    overrides = {}
    for name, value in r.table.items():
        if name in tunables:
            try:
                overrides[name] = tunables[name].check(value)
            except ValueError as exc:
                r.fail(name, str(exc))
    return Detection(pool, window, page, overrides)


def _exclusion(path: Path, i: int, item: Any, tz: str) -> Exclusion:
    r = _Reader(path, f"[[exclusion]] #{i + 1}", item)
    r.check_keys(
        {
            "name",
            "reason",
            "tenant_ids",
            "api_key_ids",
            "client_cidrs",
            "user_agent_regex",
            "start",
            "end",
        }
    )
    name = r.get("name", str, required=True)
    r.where = f"[[exclusion]] {name!r}"
    cidrs = r.strings("client_cidrs")
    for c in cidrs:
        try:
            ipaddress.ip_network(c, strict=False)
        except ValueError:
            r.fail("client_cidrs", f"not a CIDR: {c!r}")
    regex = r.get("user_agent_regex", str)
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            r.fail("user_agent_regex", f"not a valid regular expression: {exc}")
    ex = Exclusion(
        name=name,
        reason=r.get("reason", str, ""),
        tenant_ids=r.strings("tenant_ids"),
        api_key_ids=r.strings("api_key_ids"),
        client_cidrs=cidrs,
        user_agent_regex=regex,
        start=r.instant("start", tz),
        end=r.instant("end", tz),
    )
    if not (ex.tenant_ids or ex.api_key_ids or ex.client_cidrs or ex.user_agent_regex):
        # A rule with only a time window would exclude every customer in it: refuse it.
        r.fail(
            "tenant_ids",
            "an exclusion needs tenant_ids, api_key_ids, client_cidrs "
            "or user_agent_regex (a time window alone would exclude every customer)",
        )
    return ex
