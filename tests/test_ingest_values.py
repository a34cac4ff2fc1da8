"""Values no real log can hold are rejected with their column and reason, never loaded.

The bounds live in ``forensics.schema`` (VALUE_BOUNDS, the timestamp range, NOT_BEFORE); the
timestamp parser is checked form by form with generated instants (hypothesis).
"""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cache
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from forensics import schema
from forensics.db import connect
from forensics.ingest import ingest_file

BASE = {
    "request_id": "r",
    "tenant_id": "t",
    "received_at": "2026-09-08T14:00:00Z",
    "prompt_tokens": 5,
    "http_status": 200,
}
TOKENS = "token counts are 0 to 100,000,000"
TIMES = "timestamps are 2000-01-01 to 2099-12-31, UTC"


_shared: list = []


def _emptied():
    """One in-memory database for the generated cases, emptied before each load (opening a
    database costs more than loading a few rows)."""
    if not _shared:
        _shared.append(connect(":memory:"))
    con = _shared[0]
    for table in (*schema.KINDS, "rejects", "evidence"):
        con.execute(f"DELETE FROM {table}")
    return con


def load(rows: list[dict], kind: str = "requests", tz: str = "UTC", suffix: str = ".jsonl"):
    """Ingest rows (JSON Lines or CSV of text values) into the shared database, emptied.

    Returns the connection, the file result and the rejects as (row, column, reason).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"evidence{suffix}"
        if suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            names = list(dict.fromkeys(k for r in rows for k in r))
            lines = [",".join(names)] + [",".join(str(r.get(n, "")) for n in names) for r in rows]
            path.write_text("\n".join(lines) + "\n")
        con = _emptied()
        result = ingest_file(con, path, kind, timezone=tz)
    assert result.rows_read == result.rows_loaded + result.rows_rejected == len(rows)
    rejects = con.execute(
        "SELECT source_row, column_name, reason FROM rejects ORDER BY source_row"
    ).fetchall()
    return con, result, rejects


# --- counts, durations, codes ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, change, column, reason",
    [
        ("requests", {"prompt_tokens": -5}, "prompt_tokens", f"out of range: '-5' ({TOKENS})"),
        (
            "requests",
            {"prompt_tokens": 100_000_001},
            "prompt_tokens",
            f"out of range: '100000001' ({TOKENS})",
        ),
        (
            "requests",
            {"completion_tokens": "1e12"},
            "completion_tokens",
            f"out of range: '1e12' ({TOKENS})",
        ),
        ("requests", {"cached_tokens": -1}, "cached_tokens", f"out of range: '-1' ({TOKENS})"),
        (
            "requests",
            {"ttft_ms": -0.5},
            "ttft_ms",
            "out of range: '-0.5' (durations in ms are 0 to 86,400,000)",
        ),
        (
            "requests",
            {"ttft_ms": "NaN"},
            "ttft_ms",
            "out of range: 'NaN' (durations in ms are 0 to 86,400,000)",
        ),
        (
            "requests",
            {"e2e_ms": "inf"},
            "e2e_ms",
            "out of range: 'inf' (durations in ms are 0 to 86,400,000)",
        ),
        (
            "requests",
            {"http_status": 600},
            "http_status",
            "out of range: '600' (HTTP status codes are 0 to 599)",
        ),
        (
            "requests",
            {"dp_rank": -1},
            "dp_rank",
            "out of range: '-1' (data-parallel ranks are 0 to 65,535)",
        ),
    ],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_an_impossible_value_is_rejected_naming_its_column_and_bounds(
    suffix, kind, change, column, reason
):
    rows = [BASE, dict(BASE, request_id="bad", **change)]
    con, result, rejects = load(rows, kind, suffix=suffix)
    assert (result.rows_loaded, result.rows_rejected) == (1, 1)
    assert rejects == [(2, column, reason)]
    assert con.execute("SELECT request_id FROM requests").fetchall() == [("r",)]


def test_bounds_at_their_edges_load():
    rows = [
        dict(BASE, request_id="low", prompt_tokens=0, http_status=0, ttft_ms=0, dp_rank=0),
        dict(
            BASE,
            request_id="high",
            prompt_tokens=100_000_000,
            http_status=599,
            ttft_ms=86_400_000,
            dp_rank=65_535,
            received_at="2099-12-31T23:59:59.999999Z",
        ),
        dict(BASE, request_id="first", received_at="2000-01-01T00:00:00Z"),
    ]
    _, result, rejects = load(rows)
    assert rejects == [] and result.rows_loaded == 3


@pytest.mark.parametrize(
    "kind, row, column, reason",
    [
        (
            "engine_legs",
            {
                "request_id": "r",
                "role": "decode",
                "node": "d0",
                "started_at": "2026-09-08T14:00:00Z",
                "reserved_tokens": -8,
            },
            "reserved_tokens",
            f"out of range: '-8' ({TOKENS})",
        ),
        (
            "pool_snapshots",
            {"node": "p0", "observed_at": "2026-09-08T14:00:00Z", "max_total_num_tokens": 0},
            "max_total_num_tokens",
            "out of range: '0' (KV pool sizes in tokens are 1 to 2,147,483,647)",
        ),
        (
            "pool_snapshots",
            {
                "node": "p0",
                "observed_at": "2026-09-08T14:00:00Z",
                "max_total_num_tokens": 100,
                "page_size": 0,
            },
            "page_size",
            "out of range: '0' (page sizes in tokens are 1 to 1,048,576)",
        ),
        (
            "kv_allocations",
            {
                "node": "d0",
                "request_id": "r",
                "at": "2026-09-08T14:00:00Z",
                "op": "alloc",
                "first_page": -1,
                "page_count": 3,
            },
            "first_page",
            "out of range: '-1' (page numbers and counts are 0 to 2,147,483,647)",
        ),
    ],
)
def test_every_kind_rejects_impossible_values(kind, row, column, reason):
    _, _, rejects = load([row], kind)
    assert rejects == [(1, column, reason)]


def test_every_number_column_has_bounds():
    numeric = {
        c.name for k in schema.KINDS for c in schema.columns(k) if c.type in ("int", "float")
    }
    assert numeric == set(schema.VALUE_BOUNDS)


def test_order_rules_compare_with_a_column_read_before():
    for kind, rules in schema.NOT_BEFORE.items():
        names = [c.name for c in schema.columns(kind)]
        for later, earlier in rules:
            assert names.index(earlier) < names.index(later), (kind, later, earlier)


# --- one record's events in order -------------------------------------------------------------


@pytest.mark.parametrize(
    "change, column, reason",
    [
        (
            {"completed_at": "2026-09-08T13:59:59Z"},
            "completed_at",
            "before received_at: '2026-09-08T13:59:59Z' is earlier than received_at "
            "(2026-09-08 14:00:00+00)",
        ),
        (
            {"first_token_at": "2026-09-08T13:00:00Z"},
            "first_token_at",
            "before received_at: '2026-09-08T13:00:00Z' is earlier than received_at "
            "(2026-09-08 14:00:00+00)",
        ),
        (
            {"first_token_at": "2026-09-08T14:00:02Z", "completed_at": "2026-09-08T14:00:01.5Z"},
            "completed_at",
            "before first_token_at: '2026-09-08T14:00:01.5Z' is earlier than first_token_at "
            "(2026-09-08 14:00:02+00)",
        ),
    ],
)
def test_a_completion_before_its_arrival_is_rejected(change, column, reason):
    same_instant = dict(
        BASE, request_id="ok", first_token_at=BASE["received_at"], completed_at=1788876000
    )
    _, result, rejects = load([same_instant, dict(BASE, **change)])
    assert rejects == [(2, column, reason)]
    assert result.rows_loaded == 1


def test_a_leg_finishing_before_it_started_is_rejected():
    leg = {"request_id": "r", "role": "prefill", "node": "p0", "started_at": "2026-09-08T14:00:01Z"}
    _, _, rejects = load([dict(leg, finished_at="2026-09-08T14:00:00Z")], "engine_legs")
    assert rejects == [
        (
            1,
            "finished_at",
            "before started_at: '2026-09-08T14:00:00Z' is earlier than started_at "
            "(2026-09-08 14:00:01+00)",
        )
    ]


# --- timestamps out of range and impossible ----------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "10000-01-01T00:00:00Z",
        "1999-12-31T23:59:59.999999Z",
        "2100-01-01T00:00:00Z",
        "1970-01-01T00:00:00Z",
        "0001-01-01 00:00:00",
        "infinity",
        0,
        -1788876123,
        "1e30",
        "-1e30",
        "123456789012345678901234567890",
        253402300800,  # year 10000 in seconds is read as milliseconds: 1978
    ],
)
def test_a_timestamp_outside_2000_to_2099_is_rejected(value):
    _, _, rejects = load([dict(BASE, received_at=value)])
    shown = value if isinstance(value, str) else str(value)
    assert rejects == [(1, "received_at", f"out of range: '{shown}' ({TIMES})")]


@pytest.mark.parametrize("value", ["2026-02-30T10:00:00Z", "2026-09-08T23:59:60Z", "2026-13-01"])
def test_an_impossible_date_is_not_a_timestamp(value):
    _, _, rejects = load([dict(BASE, received_at=value)])
    assert rejects == [(1, "received_at", f"not a timestamp: '{value}'")]


ROME_FORWARD = (
    "nonexistent local time: '2026-03-29 02:30:00' falls where the clocks of Europe/Rome "
    "went forward"
)
ROME_BACK = (
    "ambiguous local time: '2026-10-25 02:30:00' happened twice in Europe/Rome "
    "(the clocks went back); log it with an offset"
)


def test_a_naive_time_the_clocks_skipped_or_repeated_is_rejected():
    rows = [
        dict(BASE, request_id="gap", received_at="2026-03-29 02:30:00"),
        dict(BASE, request_id="fold", received_at="2026-10-25 02:30:00"),
        dict(BASE, request_id="before", received_at="2026-10-25 01:59:59"),
        dict(BASE, request_id="after", received_at="2026-10-25 03:00:00"),
        dict(BASE, request_id="offset", received_at="2026-10-25 02:30:00+01:00"),
    ]
    con, _, rejects = load(rows, tz="Europe/Rome")
    assert rejects == [(1, "received_at", ROME_FORWARD), (2, "received_at", ROME_BACK)]
    loaded = con.execute("SELECT request_id, received_at FROM requests ORDER BY 2").fetchall()
    assert loaded == [
        ("before", datetime(2026, 10, 24, 23, 59, 59, tzinfo=UTC)),
        ("offset", datetime(2026, 10, 25, 1, 30, tzinfo=UTC)),
        ("after", datetime(2026, 10, 25, 2, 0, tzinfo=UTC)),
    ]


def test_parquet_typed_values_meet_the_same_bounds(tmp_path, memory_db):
    table = pa.table(
        {
            "request_id": ["ok", "far", "neg", "nan", "gap"],
            "tenant_id": ["t"] * 5,
            "received_at": pa.array(
                [
                    datetime(2026, 9, 8, 16),
                    datetime(2150, 1, 1),
                    datetime(2026, 9, 8, 16),
                    datetime(2026, 9, 8, 16),
                    datetime(2026, 3, 29, 2, 30),
                ],
                pa.timestamp("us"),
            ),
            "prompt_tokens": pa.array([5, 5, -5, 5, 5], pa.int64()),
            "http_status": pa.array([200] * 5, pa.int32()),
            "ttft_ms": pa.array([1.0, 1.0, 1.0, float("nan"), 1.0], pa.float64()),
        }
    )
    pq.write_table(table, tmp_path / "r.parquet")
    ingest_file(memory_db, tmp_path / "r.parquet", "requests", timezone="Europe/Rome")
    assert memory_db.execute(
        "SELECT source_row, column_name, reason FROM rejects ORDER BY 1"
    ).fetchall() == [
        (2, "received_at", f"out of range: '2150-01-01 00:00:00' ({TIMES})"),
        (3, "prompt_tokens", f"out of range: '-5' ({TOKENS})"),
        (4, "ttft_ms", "out of range: 'nan' (durations in ms are 0 to 86,400,000)"),
        (
            5,
            "received_at",
            "nonexistent local time: '2026-03-29 02:30:00' falls where the clocks of "
            "Europe/Rome went forward",
        ),
    ]


# --- the timestamp parser, form by form (property-based) -----------------------------------------

LOW, HIGH = datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Zones whose rules are settled (the parser's zone data and Python's may differ on rules
# announced recently): none, whole-hour and half-hour offsets, 1-hour and 30-minute shifts.
ZONES = ["UTC", "Europe/Rome", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]

instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31, 23, 59, 59, 999999)
).map(lambda d: d.replace(tzinfo=UTC))
nanos = st.integers(0, 999)


def _fraction(us: int, ns: int, digits: int) -> tuple[str, int]:
    """A fraction of a second with ``digits`` digits and the microseconds it stands for
    (digits beyond the sixth are dropped, as the parser does)."""
    nine = f"{us:06d}{ns:03d}"[:digits]
    kept = int((nine + "000000")[:6]) if digits else 0
    return (f".{nine}" if digits else ""), kept


@st.composite
def rfc3339(draw):
    """RFC 3339 text: Z or an offset, T or space, 0 to 9 fraction digits."""
    instant, ns = draw(instants), draw(nanos)
    frac, us = _fraction(instant.microsecond, ns, draw(st.integers(0, 9)))
    minutes = draw(st.one_of(st.just(0), st.integers(-14 * 60, 14 * 60)))
    offset = timedelta(minutes=minutes)
    local = instant + offset
    sep = draw(st.sampled_from(["T", " "]))
    sign, hours, mins = "+" if minutes >= 0 else "-", abs(minutes) // 60, abs(minutes) % 60
    if minutes == 0 and draw(st.booleans()):
        zone = draw(st.sampled_from(["Z", "z"]))
    else:
        zone = draw(
            st.sampled_from([f"{sign}{hours:02d}:{mins:02d}", f"{sign}{hours:02d}{mins:02d}"])
        )
    text = f"{local:%Y-%m-%d}{sep}{local:%H:%M:%S}{frac}{zone}"
    return text, "UTC", instant.replace(microsecond=us)


@st.composite
def naive(draw):
    """A wall-clock time in the manifest's zone, as a clock there showed it."""
    instant, tz = draw(instants), draw(st.sampled_from(ZONES))
    frac, us = _fraction(instant.microsecond, 0, draw(st.sampled_from([0, 3, 6])))
    wall = instant.astimezone(ZoneInfo(tz)).replace(tzinfo=None)
    sep = draw(st.sampled_from(["T", " "]))
    text = f"{wall:%Y-%m-%d}{sep}{wall:%H:%M:%S}{frac}"
    expected = instant.replace(microsecond=us)
    # The hour the clocks go back shows its wall times twice: which instant is meant is unknown.
    zone = ZoneInfo(tz)
    readings = {wall.replace(tzinfo=zone, fold=f).astimezone(UTC) for f in (0, 1)}
    return text, tz, None if len(readings) > 1 else expected


@st.composite
def epoch(draw):
    """Epoch seconds, ms, us or ns: integers, fractions as text, JSON numbers or strings."""
    instant, ns = draw(instants), draw(nanos)
    total = (instant - EPOCH) // timedelta(microseconds=1) * 1000 + ns  # nanoseconds
    scale = draw(st.sampled_from([9, 6, 3, 0]))  # s, ms, us, ns
    whole, rest = divmod(total, 10**scale)
    digits = draw(st.integers(0, scale))
    value = Decimal(whole) + (
        Decimal(rest // 10 ** (scale - digits)) / Decimal(10**digits) if digits else 0
    )
    text = str(whole) + (f".{rest:0{scale}d}"[: digits + 1] if digits else "")
    micros = int(value * Decimal(10) ** (6 - 9 + scale) // 1)  # floor, whatever the unit
    expected = EPOCH + timedelta(microseconds=micros)
    if not digits and draw(st.booleans()):
        return int(text), "UTC", expected  # a JSON number
    return text, "UTC", expected


def _check(cases: list[tuple], suffix: str) -> None:
    """Load one value per row (grouped by zone) and compare with what each should give."""
    for tz in sorted({c[1] for c in cases}):
        batch = [c for c in cases if c[1] == tz]
        rows = [dict(BASE, request_id=f"r{i}", received_at=c[0]) for i, c in enumerate(batch)]
        con, _, rejects = load(
            rows,
            tz=tz,
            suffix=suffix,
        )
        loaded = dict(con.execute("SELECT source_row, received_at FROM requests").fetchall())
        reasons = {row: (column, reason) for row, column, reason in rejects}
        for row, (value, _, expected) in enumerate(batch, start=1):
            if expected is None:
                assert reasons[row][0] == "received_at", value
                assert reasons[row][1].startswith("ambiguous local time: "), value
            else:
                assert row not in reasons, (value, reasons.get(row))
                assert loaded[row] == expected, value


# Sized for CI: a few seconds each, many values per example (one load per zone).
PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMS = st.lists(st.one_of(rfc3339(), naive(), epoch()), min_size=1, max_size=24)


@PROPERTY
@given(FORMS, st.sampled_from([".jsonl", ".csv"]))
def test_every_timestamp_form_reads_the_instant_it_names(cases, suffix):
    if suffix == ".csv":
        cases = [(str(v), tz, e) for v, tz, e in cases]
    _check(cases, suffix)


@cache
def _changes(tz: str, year: int) -> list[datetime]:
    """The hours of ``year`` (UTC) that begin just after the zone's offset changed."""
    zone = ZoneInfo(tz)

    def offset(t: datetime) -> timedelta | None:
        return t.astimezone(zone).utcoffset()

    days = [datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=d) for d in range(367)]
    found = []
    for start, end in zip(days, days[1:], strict=False):
        if offset(start) != offset(end):
            hours = [start + timedelta(hours=h) for h in range(25)]
            found += [b for a, b in zip(hours, hours[1:], strict=False) if offset(a) != offset(b)]
    return found


@st.composite
def wall_clock(draw):
    """Any wall-clock time in a zone, including ones the clocks skipped or repeated."""
    tz = draw(st.sampled_from(ZONES[1:]))
    zone = ZoneInfo(tz)
    # Near a change of offset, where the interesting wall times are.
    changes = _changes(tz, draw(st.integers(2000, 2037)))
    if not changes:
        instant = draw(instants).replace(microsecond=0)
        wall = instant.astimezone(zone).replace(tzinfo=None)
    else:
        change = draw(st.sampled_from(changes))
        wall = change.astimezone(zone) + timedelta(minutes=draw(st.integers(-150, 150)))
        wall = wall.replace(tzinfo=None)
    readings = {}
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:
            readings[instant] = fold
    return f"{wall:%Y-%m-%d %H:%M:%S}", tz, sorted(readings)


@PROPERTY
@given(st.lists(wall_clock(), min_size=1, max_size=10))
def test_a_wall_clock_time_loads_only_when_it_names_one_instant(cases):
    for tz in sorted({c[1] for c in cases}):
        batch = [c for c in cases if c[1] == tz]
        rows = [dict(BASE, request_id=f"r{i}", received_at=c[0]) for i, c in enumerate(batch)]
        con, _, rejects = load(
            rows,
            tz=tz,
        )
        loaded = dict(con.execute("SELECT source_row, received_at FROM requests").fetchall())
        reasons = {row: reason for row, _, reason in rejects}
        for row, (text, _, readings) in enumerate(batch, start=1):
            if len(readings) == 1:
                assert loaded.get(row) == readings[0], (text, tz, reasons.get(row))
            elif not readings:
                assert reasons[row].startswith(f"nonexistent local time: '{text}'"), (text, tz)
            else:
                assert reasons[row].startswith(f"ambiguous local time: '{text}'"), (text, tz)


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(1999, 12, 31)),
                st.datetimes(min_value=datetime(2100, 1, 1), max_value=datetime(9999, 12, 31)),
            ),
            st.sampled_from(["iso", "naive", "s", "ms", "us", "ns"]),
        ),
        min_size=1,
        max_size=24,
    )
)
def test_an_instant_outside_the_range_is_rejected_in_every_form(cases):
    values = []
    for when, form in cases:
        # The unit of an epoch number is told by its magnitude, so an instant of the first
        # seven weeks of 1970 in ms, us or ns is, read in a coarser unit, an instant of
        # 2000-2099: a number no log of this century holds, and not what this test is about.
        assume(
            form in ("iso", "naive", "s") or not datetime(1970, 1, 1) <= when < datetime(1970, 3, 1)
        )
        if form == "iso":
            values.append(f"{when.year:04d}{when:-%m-%dT%H:%M:%S}Z")
        elif form == "naive":
            values.append(f"{when.year:04d}{when:-%m-%d %H:%M:%S}")
        else:
            seconds = (when.replace(tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
            scale = {"s": 10**-6, "ms": 10**-3, "us": 1, "ns": 1000}[form]
            values.append(str(int(Decimal(seconds) * Decimal(str(scale)))))
    rows = [dict(BASE, request_id=f"r{i}", received_at=v) for i, v in enumerate(values)]
    _, result, rejects = load(
        rows,
    )
    assert result.rows_loaded == 0
    assert [(c, r.split(": '")[0]) for _, c, r in rejects] == [
        ("received_at", "out of range")
    ] * len(values), list(zip(values, rejects, strict=True))
