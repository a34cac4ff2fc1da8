"""The canonical schema: the one contract shared by ingest, detection, scoping and the simulator.

Every evidence kind has a fixed list of typed columns (the README's Evidence section). Ingest
maps input columns onto these by name; anything else lands in ``extra`` (JSON). Each loaded row
also carries ``evidence_id`` and ``source_row`` so every finding can point back at the line it
came from.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("requests", "engine_legs", "pool_snapshots", "kv_allocations", "tenants")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # one of: string, int, float, timestamp
    required: bool = False


def _cols(*spec: tuple) -> tuple[Column, ...]:
    return tuple(Column(*s) for s in spec)


CANONICAL: dict[str, tuple[Column, ...]] = {
    "requests": _cols(
        ("request_id", "string", True),
        ("tenant_id", "string", True),
        ("received_at", "timestamp", True),
        ("prompt_tokens", "int", True),
        ("http_status", "int", True),
        ("completion_tokens", "int"),
        ("cached_tokens", "int"),
        ("first_token_at", "timestamp"),
        ("completed_at", "timestamp"),
        ("ttft_ms", "float"),
        ("e2e_ms", "float"),
        ("finish_reason", "string"),
        ("model", "string"),
        ("prefill_node", "string"),
        ("decode_node", "string"),
        ("dp_rank", "int"),
        ("bootstrap_room", "string"),
        ("api_key_id", "string"),
        ("client_ip", "string"),
        ("user_agent", "string"),
    ),
    "engine_legs": _cols(
        ("request_id", "string", True),
        ("role", "string", True),
        ("node", "string", True),
        ("started_at", "timestamp", True),
        ("finished_at", "timestamp"),
        ("input_tokens", "int"),
        ("reserved_tokens", "int"),
        ("transferred_tokens", "int"),
        ("bootstrap_room", "string"),
        ("dp_rank", "int"),
        ("finish_type", "string"),
        ("status_code", "int"),
        ("error", "string"),
    ),
    "pool_snapshots": _cols(
        ("node", "string", True),
        ("observed_at", "timestamp", True),
        ("max_total_num_tokens", "int", True),
        ("role", "string"),
        ("max_req_input_len", "int"),
        ("context_length", "int"),
        ("page_size", "int"),
        ("dp_size", "int"),
        ("engine_version", "string"),
    ),
    "kv_allocations": _cols(
        ("node", "string", True),
        ("dp_rank", "int"),
        ("request_id", "string", True),
        ("at", "timestamp", True),
        ("op", "string", True),
        ("first_page", "int", True),
        ("page_count", "int", True),
    ),
    "tenants": _cols(
        ("tenant_id", "string", True),
        ("name", "string"),
        ("contact", "string"),
    ),
}

# The column whose value orders a kind in time (first/last timestamp of a file, coverage).
TIME_COLUMN = {
    "requests": "received_at",
    "engine_legs": "started_at",
    "pool_snapshots": "observed_at",
    "kv_allocations": "at",
    "tenants": None,
}

SQL_TYPE = {"string": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "timestamp": "TIMESTAMPTZ"}


# --- what a real log can hold ---------------------------------------------------------------
# The one place the bounds of canonical values are written down (the README's Guarantees
# section repeats them). Ingest rejects a value outside its bounds, naming the column and the
# bounds, instead of loading it as a fact: no log of a real request holds a prompt of -5
# tokens, a time to first token below zero or a timestamp in the year 10000.


@dataclass(frozen=True)
class Bounds:
    """The inclusive range of a numeric column and how a reject reason names it."""

    low: int | float
    high: int | float
    what: str  # plural noun for the reason: "token counts are 0 to 100,000,000"

    def describe(self) -> str:
        """The bounds as the reason of a reject states them.

        >>> TOKENS.describe()
        'token counts are 0 to 100,000,000'
        """
        return f"{self.what} are {self.low:,} to {self.high:,}"


# 100 million tokens is ten times the largest context window offered today (10M): a count
# beyond it is no prompt, answer or reservation a server handled.
TOKENS = Bounds(0, 100_000_000, "token counts")
POSITIVE_TOKENS = Bounds(1, 100_000_000, "context lengths")
POOL_TOKENS = Bounds(1, 2**31 - 1, "KV pool sizes in tokens")
# 0 is what proxies log for a request that never got a response; 599 is the last HTTP status.
STATUS = Bounds(0, 599, "HTTP status codes")
# A day: no first token or whole answer takes longer and still reaches a client.
DURATION_MS = Bounds(0, 86_400_000, "durations in ms")
RANKS = Bounds(0, 65_535, "data-parallel ranks")
SIZES = Bounds(1, 65_536, "data-parallel sizes")
PAGE_SIZES = Bounds(1, 1_048_576, "page sizes in tokens")
PAGES = Bounds(0, 2**31 - 1, "page numbers and counts")

VALUE_BOUNDS: dict[str, Bounds] = {
    "prompt_tokens": TOKENS,
    "completion_tokens": TOKENS,
    "cached_tokens": TOKENS,
    "input_tokens": TOKENS,
    "reserved_tokens": TOKENS,
    "transferred_tokens": TOKENS,
    "max_req_input_len": TOKENS,
    "context_length": POSITIVE_TOKENS,
    "max_total_num_tokens": POOL_TOKENS,
    "http_status": STATUS,
    "status_code": STATUS,
    "ttft_ms": DURATION_MS,
    "e2e_ms": DURATION_MS,
    "dp_rank": RANKS,
    "dp_size": SIZES,
    "page_size": PAGE_SIZES,
    "first_page": PAGES,
    "page_count": PAGES,
}

# Timestamps: from 2000-01-01 (inclusive) to 2100-01-01 (exclusive), UTC. No LLM serving log
# predates 2000; earlier values are unset clocks (epoch 0) or misread units, later ones typos.
TIME_LOW = "2000-01-01 00:00:00+00"
TIME_HIGH = "2100-01-01 00:00:00+00"
TIME_BOUNDS_TEXT = "timestamps are 2000-01-01 to 2099-12-31, UTC"

# (column, other): within one row, ``column`` cannot be earlier than ``other`` (one record's
# events happen in order). ``other`` always comes first in the kind's columns, so its own
# problems are reported before the order is judged.
NOT_BEFORE: dict[str, tuple[tuple[str, str], ...]] = {
    "requests": (
        ("first_token_at", "received_at"),
        ("completed_at", "received_at"),
        ("completed_at", "first_token_at"),
    ),
    "engine_legs": (("finished_at", "started_at"),),
}

# Kinds where one row stands for one event, with the columns that identify it (request_id
# first: it is the column a duplicate's reject names). A later row with the same identity is a
# duplicate: the first loaded is kept and the others are rejected, as an exact duplicate (same
# content: overlapping log files) or a conflicting one (different content: a retry logged
# twice, a replayed or edited log). Engine legs are identified by request, role, node and
# start, so a leg retried later or elsewhere is a leg of its own; an allocation logs one row
# per run of pages, so a run is identified by its first page too. Pool snapshots and tenant
# profiles are left alone: a repeated snapshot or profile changes no finding.
IDENTITY: dict[str, tuple[str, ...]] = {
    "requests": ("request_id",),
    "engine_legs": ("request_id", "role", "node", "started_at"),
    "kv_allocations": ("request_id", "node", "dp_rank", "at", "op", "first_page"),
}


def columns(kind: str) -> tuple[Column, ...]:
    """The canonical columns of one evidence kind.

    >>> [c.name for c in columns("tenants")]
    ['tenant_id', 'name', 'contact']
    """
    return CANONICAL[kind]


def required(kind: str) -> list[str]:
    """Names of the required columns of one kind.

    >>> required("pool_snapshots")
    ['node', 'observed_at', 'max_total_num_tokens']
    """
    return [c.name for c in CANONICAL[kind] if c.required]


# Columns that hold a value of their own on nearly every row (a request's id, its bootstrap
# room), stored as they are. DuckDB's default string compression finds no dictionary to share
# in them and spends more time compressing (at ingest) and decompressing (in every join on
# them) than it saves: at 16M requests, uncompressed, ingest took 45 s instead of 54 s and
# detection 65 s instead of 70-80 s, the case database 3.8 GB instead of 2.4 GB.
UNCOMPRESSED = {
    ("requests", "request_id"),
    ("requests", "bootstrap_room"),
    ("engine_legs", "request_id"),
    ("engine_legs", "bootstrap_room"),
    ("kv_allocations", "request_id"),
}


def table_ddl(kind: str) -> str:
    """CREATE TABLE statement of a canonical table, with provenance and ``extra`` columns.

    >>> print(table_ddl("tenants"))
    CREATE TABLE IF NOT EXISTS tenants (
      "tenant_id" VARCHAR,
      "name" VARCHAR,
      "contact" VARCHAR,
      extra JSON,
      evidence_id INTEGER NOT NULL,
      source_row BIGINT NOT NULL
    )
    >>> table_ddl("requests").splitlines()[1]
    '  "request_id" VARCHAR USING COMPRESSION uncompressed,'
    """
    cols = [
        f'"{c.name}" {SQL_TYPE[c.type]}'
        + (" USING COMPRESSION uncompressed" if (kind, c.name) in UNCOMPRESSED else "")
        for c in CANONICAL[kind]
    ]
    cols += ["extra JSON", "evidence_id INTEGER NOT NULL", "source_row BIGINT NOT NULL"]
    return f"CREATE TABLE IF NOT EXISTS {kind} (\n  " + ",\n  ".join(cols) + "\n)"


BOOKKEEPING_DDL = (
    "CREATE SEQUENCE IF NOT EXISTS evidence_seq START 1",
    """CREATE TABLE IF NOT EXISTS evidence (
  evidence_id INTEGER PRIMARY KEY,
  path VARCHAR NOT NULL,
  sha256 VARCHAR NOT NULL UNIQUE,
  bytes BIGINT NOT NULL,
  kind VARCHAR NOT NULL,
  format VARCHAR NOT NULL,
  rows_read BIGINT NOT NULL,
  rows_loaded BIGINT NOT NULL,
  rows_rejected BIGINT NOT NULL,
  first_at TIMESTAMPTZ,
  last_at TIMESTAMPTZ,
  loaded_at TIMESTAMPTZ NOT NULL,
  CHECK (rows_read = rows_loaded + rows_rejected)
)""",
    """CREATE TABLE IF NOT EXISTS rejects (
  evidence_id INTEGER NOT NULL,
  path VARCHAR NOT NULL,
  source_row BIGINT NOT NULL,
  column_name VARCHAR,
  reason VARCHAR NOT NULL,
  raw VARCHAR
)""",
    # What became of each loaded file: loaded whole, or partial (a damaged compressed file:
    # the rows before the damage loaded) with the problem and the rows lost (NULL: unknown).
    # Added by ALTER so that databases made before these columns get them too (CREATE TABLE IF
    # NOT EXISTS leaves an existing table as it is); their files loaded whole.
    "ALTER TABLE evidence ADD COLUMN IF NOT EXISTS outcome VARCHAR DEFAULT 'loaded'",
    "ALTER TABLE evidence ADD COLUMN IF NOT EXISTS problem VARCHAR",
    "ALTER TABLE evidence ADD COLUMN IF NOT EXISTS rows_lost BIGINT DEFAULT 0",
    # Evidence that loaded nothing: files that failed entirely (outcome 'failed') and patterns
    # that matched no file (outcome 'missing'). ``source`` says which ingest recorded the row:
    # 'manifest' rows are the state of the case manifest at its last ingest (replaced whole each
    # time), 'files' rows come from loading files by name. ``entry`` is the [[evidence]] number;
    # ``file`` the resolved path of a failed file, so that loading it later clears the failure.
    # Evidence read in place by Spark (forensics.lake): the kinds whose rows stay where they
    # lie, each with the rows loaded there. Their tables here are then empty, and a detection
    # that does not read in place refuses the case rather than find nothing in it.
    """CREATE TABLE IF NOT EXISTS evidence_in_place (
  kind VARCHAR NOT NULL,
  rows_loaded BIGINT NOT NULL,
  read_at TIMESTAMPTZ NOT NULL,
  master VARCHAR
)""",
    """CREATE TABLE IF NOT EXISTS evidence_failures (
  source VARCHAR NOT NULL,
  entry INTEGER,
  path VARCHAR NOT NULL,
  file VARCHAR,
  kind VARCHAR NOT NULL,
  format VARCHAR NOT NULL,
  outcome VARCHAR NOT NULL,
  reason VARCHAR NOT NULL,
  sha256 VARCHAR,
  bytes BIGINT,
  rows_lost BIGINT
)""",
)


def all_ddl() -> list[str]:
    """Every statement that creates an empty case database."""
    return list(BOOKKEEPING_DDL) + [table_ddl(k) for k in KINDS]


# Findings: what detection writes and scoping/reporting read. Detection replaces these tables
# whole on every run, so a finding never outlives the evidence it came from.
# ``evidence`` columns hold a JSON list of {"table", "evidence_id", "source_row"} pointers.
#
# Detection writes them as temporary tables of its own connection, which shadow the database's
# tables of the same names there, and db.publish_findings() copies them into the database in
# one short transaction: a detection killed or failed leaves the previous findings whole, yet
# runs outside a transaction. Inside one, DuckDB keeps every working table that detection
# creates, replaces and drops until the commit: at 100M requests those filled the disk.
FINDINGS_DDL = {
    # One row per detector per run: what ran, with which parameters, and how many hits.
    "findings_detectors": """CREATE OR REPLACE TEMP TABLE findings_detectors (
  detector_id VARCHAR, title VARCHAR, severity VARCHAR, description VARCHAR,
  parameters JSON, hits BIGINT, ordinal INTEGER)""",
    # One row per (request, signal) a detector raised.
    "findings_signals": """CREATE OR REPLACE TEMP TABLE findings_signals (
  request_id VARCHAR, signal VARCHAR, detector_id VARCHAR, value DOUBLE, threshold DOUBLE,
  detail VARCHAR, evidence JSON)""",
    # One row per request with a verdict (confirmed | likely | possible).
    "findings_affected": """CREATE OR REPLACE TEMP TABLE findings_affected (
  request_id VARCHAR, tenant_id VARCHAR, received_at TIMESTAMPTZ, prompt_tokens BIGINT,
  threshold_tokens BIGINT, verdict VARCHAR, signals VARCHAR, model VARCHAR,
  prefill_node VARCHAR, decode_node VARCHAR, dp_rank BIGINT, excluded_by VARCHAR,
  evidence JSON, note VARCHAR)""",
    # Whose KV each affected response read. method: allocation_log | allocator_replay |
    # temporal; confidence: exact | high | low. rank orders temporal candidates (1 = newest).
    "findings_exposures": """CREATE OR REPLACE TEMP TABLE findings_exposures (
  recipient_request_id VARCHAR, recipient_tenant_id VARCHAR, source_request_id VARCHAR,
  source_tenant_id VARCHAR, method VARCHAR, tokens BIGINT, confidence VARCHAR,
  rank INTEGER, source_released_at TIMESTAMPTZ, recipient_excluded_by VARCHAR,
  source_excluded_by VARCHAR)""",
    # Per notified affected response: how completely its sources are known. status: complete
    # (every stale page's writer named), partial (some pages' writers precede the logs),
    # approximate (the replay had drifted: candidates added; or a queue order the logs do not
    # settle: both orders' writers named), candidates (temporal only),
    # none (no decode node or allocation found).
    "findings_attribution": """CREATE OR REPLACE TEMP TABLE findings_attribution (
  recipient_request_id VARCHAR, node VARCHAR, dp_rank BIGINT, method VARCHAR, status VARCHAR,
  unknown_pages BIGINT, note VARCHAR)""",
    # Per request: which exclusion rules matched it (a request may match several).
    "findings_excluded": """CREATE OR REPLACE TEMP TABLE findings_excluded (
  request_id VARCHAR, tenant_id VARCHAR, exclusion VARCHAR)""",
    # One row per exclusion rule with how much it matched.
    "findings_exclusions": """CREATE OR REPLACE TEMP TABLE findings_exclusions (
  name VARCHAR, reason VARCHAR, rule VARCHAR, requests_matched BIGINT,
  affected_matched BIGINT, tenants_matched BIGINT, ordinal INTEGER)""",
    # Exploitation assessment per recipient tenant.
    "findings_exploitation": """CREATE OR REPLACE TEMP TABLE findings_exploitation (
  tenant_id VARCHAR, score DOUBLE, level VARCHAR, reasons JSON, over_threshold_attempts BIGINT,
  affected_responses BIGINT, excluded_by VARCHAR)""",
    # Log coverage: per node and side, what the evidence spans and where it has holes.
    "findings_coverage": """CREATE OR REPLACE TEMP TABLE findings_coverage (
  scope VARCHAR, node VARCHAR, rows BIGINT, first_at TIMESTAMPTZ, last_at TIMESTAMPTZ,
  gap_count BIGINT, largest_gap_s DOUBLE, detail VARCHAR)""",
    # Case-level statements (key -> JSON value): exploitation conclusion, methods used, etc.
    "findings_case": """CREATE OR REPLACE TEMP TABLE findings_case (key VARCHAR, value JSON)""",
    # Warnings a reader must see (missing evidence kinds, fallbacks to weaker methods).
    "findings_warnings": """CREATE OR REPLACE TEMP TABLE findings_warnings (
  code VARCHAR, message VARCHAR)""",
    # What the report shows of the whole traffic (forensics.summary), so that nothing after
    # detection reads a table that grows with it. Every tenant the client requests name, and
    # whether any of its requests is not excluded.
    "findings_tenants": """CREATE OR REPLACE TEMP TABLE findings_tenants (
  tenant_id VARCHAR, customer BOOLEAN)""",
    # The tokens-against-TTFT chart's points: sample flagged (one row per verdict row) or
    # plain, in the order of a hash of the request id.
    "findings_ttft_sample": """CREATE OR REPLACE TEMP TABLE findings_ttft_sample (
  sample VARCHAR, ordinal BIGINT, prompt_tokens BIGINT, ttft_ms DOUBLE, verdict VARCHAR,
  excluded BOOLEAN)""",
    # The arrival of each request of a source tenant whose KV another response read.
    "findings_source_requests": """CREATE OR REPLACE TEMP TABLE findings_source_requests (
  request_id VARCHAR, tenant_id VARCHAR, received_at TIMESTAMPTZ)""",
}

# Scope: who is notified and who is reviewed, written by scoping right after detection (and
# published with its findings) and read by the report. Detection drops them, so a scope never
# outlives the findings it was computed from.
SCOPE_DDL = {
    # One row per notified (tenant, role): recipient or source.
    "findings_notifications": """CREATE OR REPLACE TEMP TABLE findings_notifications (
  tenant_id VARCHAR, role VARCHAR, responses BIGINT, first_at TIMESTAMPTZ,
  last_at TIMESTAMPTZ, confidence VARCHAR)""",
    # Candidates a person decides on: not notified, with the reason and the evidence.
    "findings_review": """CREATE OR REPLACE TEMP TABLE findings_review (
  tenant_id VARCHAR, role VARCHAR, responses BIGINT, first_at TIMESTAMPTZ,
  last_at TIMESTAMPTZ, confidence VARCHAR, reason VARCHAR, evidence VARCHAR)""",
}
