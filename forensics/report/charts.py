"""Charts for the report: altair specs rendered offline to inline SVG by vl-convert.

Every chart is a :class:`Chart` with an SVG (or None when there is nothing to draw) and a
caption that says what is shown, so the template can fall back to a sentence. Specs use UTC
scales (the rendering host's time zone must not change the picture) and no selections (altair
numbers those per process, which would make two renders differ).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from forensics.report.data import iso, utc
from forensics.sql import first_row

if TYPE_CHECKING:
    import duckdb

    from forensics.report.data import ReportData

VERDICT_COLORS = {
    "confirmed": "#b2182b",
    "likely": "#ef8a62",
    "possible": "#67a9cf",
    "excluded traffic": "#9e9e9e",
}


_RANK = {v: i for i, v in enumerate(VERDICT_COLORS)}
_UNIX = datetime(1970, 1, 1, tzinfo=UTC)


_FONT = "Helvetica, Arial, sans-serif"


@dataclass(frozen=True)
class Chart:
    """One figure of the report.

    Attributes:
        id: HTML id of the figure.
        title: heading.
        svg: inline SVG markup, or None when there is no data (or before :func:`draw`).
        caption: what the figure shows (or why it is empty).
        spec: the Vega-Lite specification the SVG is drawn from, or None when there is no
            data.
    """

    id: str
    title: str
    svg: str | None
    caption: str
    spec: dict | None = None


def _spec(chart) -> dict:
    return chart.to_dict()


def draw(charts: list[Chart]) -> list[Chart]:
    """The charts with their SVG drawn from their specs (by vl-convert, which holds no lock
    of Python's while it draws: a report runs this beside its other outputs)."""
    import vl_convert

    return [
        replace(c, svg=_svg(vl_convert.vegalite_to_svg(c.spec))) if c.spec else c for c in charts
    ]


def _svg(svg: str) -> str:
    # Namespace declarations are URLs; HTML needs none of them for inline SVG, and the page
    # promises no external URL of any kind.
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg, count=2)
    return svg.replace("<svg ", '<svg role="img" style="max-width:100%;height:auto" ', 1)


def _config(chart):
    return (
        chart.configure(font=_FONT)
        .configure_view(stroke="#ccc")
        .configure_axis(labelFontSize=11, titleFontSize=12)
        .configure_legend(labelFontSize=11, titleFontSize=12)
    )


_BUCKETS = (
    (timedelta(minutes=1), "minute"),
    (timedelta(minutes=5), "5 minutes"),
    (timedelta(minutes=15), "15 minutes"),
    (timedelta(hours=1), "hour"),
    (timedelta(hours=6), "6 hours"),
    (timedelta(days=1), "day"),
    (timedelta(days=7), "week"),
)


def _bucket(span: timedelta) -> tuple[timedelta, str]:
    # The smallest bucket that keeps the chart under ~48 bars: wide enough to see, fine enough
    # to show bursts.
    for size, label in _BUCKETS:
        if span <= size * 48:
            return size, label
    return _BUCKETS[-1]


def _stack_totals(values: list[dict], key: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for v in values:
        totals[v[key]] = totals.get(v[key], 0) + v["responses"]
    return totals


def _count_axis(top: int):
    import altair as alt

    # Whole-number ticks only: "1.5 responses" reads as a bug.
    step = max(1, -(-top // 5))
    return alt.Axis(values=list(range(0, top + step, step)), format="d")


def _markers(data: ReportData) -> list[dict]:
    """Timeline events worth a line on a time axis: the fix, manifest events, pool changes."""
    out = []
    for e in data.timeline:
        if e["source"] == "findings" or e["at"] is None:
            continue
        kind = "pool change" if e["source"] == "pool snapshots" else "event"
        if e["source"] == "manifest" and e.get("fix"):
            kind = "fix"
        out.append({"at": iso(e["at"]), "kind": kind, "event": e["event"]})
    # Several nodes change at one instant: one line with one label is enough.
    seen: dict[tuple[str, str], dict] = {}
    for m in out:
        seen.setdefault((m["at"], m["kind"]), m)
    return [seen[k] for k in sorted(seen)]


# Excluded traffic (researcher, our tests) is most of a typical incident's hits; drawing it
# apart keeps the customer impact readable at a glance.
_CATEGORY_SQL = "CASE WHEN coalesce(excluded_by, '') <> '' THEN 'excluded traffic' ELSE verdict END"


def affected_over_time(con: duckdb.DuckDBPyConnection, data: ReportData) -> Chart:
    """Stacked bars of affected responses per time bucket, by verdict, over the whole window,
    with the fix, manifest events and pool changes marked. Counted in SQL: the cost does not
    grow with the number of responses."""
    title = "Affected responses over time"
    first, last, n_rows = first_row(
        con,
        "SELECT min(received_at), max(received_at), count(received_at) FROM findings_affected",
    )
    if not n_rows:
        return Chart("chart-over-time", title, None, "No affected responses: nothing to plot.")
    import altair as alt

    first, last = utc(first), utc(last)
    assert first is not None and last is not None  # rows with a time exist
    # The whole analysis window, not just the span of the hits: the empty days after the fix
    # are how a reader sees that the exposure stopped.
    start = min([utc(data.window.get("start")) or first, first])
    end = max([utc(data.window.get("end")) or last, last])
    size, label = _bucket(end - start)
    epoch = start.replace(hour=0, minute=0, second=0, microsecond=0)
    size_us = size // timedelta(microseconds=1)
    counts = con.execute(
        f"""SELECT (epoch_us(received_at) - $epoch) // $size AS slot,
                   {_CATEGORY_SQL} AS category, count(*)
            FROM findings_affected WHERE received_at IS NOT NULL
            GROUP BY slot, category ORDER BY slot, category""",
        {"epoch": (epoch - _UNIX) // timedelta(microseconds=1), "size": size_us},
    ).fetchall()
    values = [
        {
            "bucket": iso(epoch + slot * size),
            "end": iso(epoch + (slot + 1) * size),
            "verdict": v,
            "rank": _RANK[v],
            "responses": n,
        }
        for slot, v, n in counts
    ]
    verdicts = [v for v in VERDICT_COLORS if any(r["verdict"] == v for r in values)]
    stack_max = max(_stack_totals(values, "bucket").values())
    x_scale = alt.Scale(type="utc", domain=[iso(epoch), iso(end)])
    bars = (
        alt.Chart(alt.Data(values=values))
        .mark_bar(stroke="white", strokeWidth=0.5)
        .encode(
            # x..x2 spans the whole bucket, so a sparse incident still shows readable bars.
            x=alt.X(
                "bucket:T",
                title=f"received (UTC, per {label})",
                scale=x_scale,
                axis=alt.Axis(format="%Y-%m-%d", labelAngle=-30),
            ),
            x2="end:T",
            y=alt.Y("sum(responses):Q", title="responses", axis=_count_axis(stack_max)),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=verdicts, range=[VERDICT_COLORS[v] for v in verdicts]),
                sort=verdicts,
            ),
            order=alt.Order("rank:Q"),
        )
    )
    layers = [bars]
    markers = _markers(data)
    if markers:
        marks = [m | {"y": 10 + 12 * (i % 4)} for i, m in enumerate(markers)]
        base = alt.Chart(alt.Data(values=marks))
        layers.append(
            base.mark_rule(strokeWidth=1.5).encode(
                x=alt.X("at:T", scale=x_scale),
                color=alt.Color(
                    "kind:N",
                    scale=alt.Scale(domain=list(MARKER_COLORS), range=list(MARKER_COLORS.values())),
                    title="marker",
                ),
                strokeDash=alt.StrokeDash(
                    "kind:N",
                    scale=alt.Scale(domain=list(MARKER_COLORS), range=[[1, 0], [4, 3], [2, 2]]),
                    legend=None,
                ),
            )
        )
        layers.append(
            base.mark_text(align="left", dx=3, fontSize=10, color="#333").encode(
                x=alt.X("at:T", scale=x_scale),
                y=alt.Y("y:Q", scale=None, axis=None),
                text="kind:N",
            )
        )
    chart = alt.layer(*layers).resolve_scale(color="independent").properties(width=640, height=220)
    caption = (
        f"{n_rows} responses with a verdict, counted per {label} of arrival (UTC) across the"
        f" whole window ({iso(epoch)} to {iso(end)}); excluded traffic in grey whatever its"
        " verdict."
    )
    if markers:
        caption += (
            " Vertical lines: "
            + "; ".join(f"{m['kind']} at {m['at']} ({m['event']})" for m in markers)
            + "."
        )
    return Chart("chart-over-time", title, None, caption, _spec(_config(chart)))


MARKER_COLORS = {"fix": "#1a7f37", "event": "#555555", "pool change": "#0b4f8a"}
FIT_FROM_TOKENS = 4096  # latency_too_good fits on prompts at least this long


def _expected_ttft(fit: dict | None) -> tuple[float, float, float] | None:
    """The expected-TTFT line latency_too_good fitted (log-log: intercept, slope) and its
    factor, from the two of its flagged requests detection recorded (``forensics.summary``):
    each signal's threshold is the factor times the expected TTFT at that prompt length, so two
    lengths give the line exactly."""
    import math

    if not fit:
        return None
    factor = float((fit.get("parameters") or {}).get("latency_factor") or 0)
    lo, hi = fit["lo_tokens"], fit["hi_tokens"]
    t_lo, t_hi = fit["lo_threshold"], fit["hi_threshold"]
    if not factor or lo == hi:
        return None
    slope = (math.log(t_hi) - math.log(t_lo)) / (math.log(hi) - math.log(lo))
    intercept = math.log(t_lo / factor) - slope * math.log(lo)
    return intercept, slope, factor


def tokens_vs_ttft(con: duckdb.DuckDBPyConnection, data: ReportData) -> Chart:
    """Prompt tokens against time to first token: flagged requests by verdict (excluded traffic
    apart), a sample of the rest, the prefill limits, and the expected-TTFT curve.

    The points were sampled by detection, by a hash of the request id
    (``findings_ttft_sample``), so the chart costs the same whatever the case's size or the
    number of hits."""
    import math

    from forensics.summary import FLAGGED_SAMPLE, PLAIN_SAMPLE

    title = "Prompt tokens against time to first token"
    ctx = (data.case_facts.get("parameters") or {}).get("context_length")
    stated = data.case_facts.get("ttft_chart") or {}
    n_flagged, n_plain = int(stated.get("flagged") or 0), int(stated.get("plain") or 0)
    beyond = int(stated.get("beyond_context") or 0)
    if not n_flagged and not n_plain:
        return Chart(
            "chart-ttft",
            title,
            None,
            "No request has both prompt tokens and a time to first token: nothing to plot.",
        )
    import altair as alt

    flagged = con.execute(
        """SELECT prompt_tokens, ttft_ms, verdict, excluded FROM findings_ttft_sample
           WHERE sample = 'flagged' ORDER BY ordinal"""
    ).fetchall()
    plain = con.execute(
        """SELECT prompt_tokens, ttft_ms FROM findings_ttft_sample
           WHERE sample = 'plain' ORDER BY ordinal"""
    ).fetchall()
    values = [
        {"prompt_tokens": p, "ttft_ms": round(float(t), 3), "verdict": "not flagged"}
        for p, t in plain
    ] + [
        {
            "prompt_tokens": p,
            "ttft_ms": round(float(t), 3),
            "verdict": "excluded traffic" if excluded else verdict,
        }
        for p, t, verdict, excluded in flagged
    ]
    present = {v["verdict"] for v in values}
    domain = [v for v in ["not flagged", *VERDICT_COLORS] if v in present]
    colors = [VERDICT_COLORS.get(v, "#bbbbbb") for v in domain]
    x_max = ctx or max(v["prompt_tokens"] for v in values)
    x_min = min(v["prompt_tokens"] for v in values)
    x_scale = alt.Scale(type="log", domain=[max(1, x_min), x_max], nice=False)
    y_scale = alt.Scale(type="log")
    points = (
        alt.Chart(alt.Data(values=values))
        .mark_point(filled=True, size=28, opacity=0.75)
        .encode(
            x=alt.X("prompt_tokens:Q", title="prompt tokens (log)", scale=x_scale),
            y=alt.Y("ttft_ms:Q", title="time to first token, ms (log)", scale=y_scale),
            color=alt.Color("verdict:N", scale=alt.Scale(domain=domain, range=colors), sort=domain),
            shape=alt.Shape("verdict:N", scale=alt.Scale(domain=domain), sort=domain),
        )
    )
    layers = [points]
    fit = _expected_ttft(stated.get("fit"))
    if fit:
        intercept, slope, factor = fit
        # Over the lengths the fit was made for (long enough that prefill, not queueing, sets
        # the TTFT) up to the end of the axis.
        lo = max(x_min, FIT_FROM_TOKENS)
        xs = [lo * (x_max / lo) ** (k / 24) for k in range(25)] if x_max > lo else []
        curve = [
            {
                "prompt_tokens": x,
                "ttft_ms": scale * math.exp(intercept + slope * math.log(x)),
                "line": name,
            }
            for name, scale in (("expected TTFT", 1.0), (f"{factor:g} x expected", factor))
            for x in xs
        ]
        names = ["expected TTFT", f"{factor:g} x expected"]
        if curve:
            layers.append(
                alt.Chart(alt.Data(values=curve))
                .mark_line(color="#555", strokeWidth=1)
                .encode(
                    x=alt.X("prompt_tokens:Q", scale=x_scale),
                    y=alt.Y("ttft_ms:Q", scale=y_scale),
                    strokeDash=alt.StrokeDash(
                        "line:N",
                        scale=alt.Scale(domain=names, range=[[1, 0], [3, 3]]),
                        sort=names,
                        title="fitted",
                    ),
                )
            )
    thresholds = sorted(
        r[0]
        for r in con.execute(
            "SELECT DISTINCT threshold_tokens FROM findings_affected WHERE threshold_tokens <> 0"
        ).fetchall()
    )
    if not thresholds:
        thresholds = sorted(
            r[0]
            for r in con.execute(
                "SELECT DISTINCT max_req_input_len FROM pool_snapshots "
                "WHERE max_req_input_len IS NOT NULL"
            ).fetchall()
        )
    thresholds = [t for t in thresholds if t <= x_max]
    if thresholds:
        # Limits can sit close together on a log axis: stagger their labels down the plot so
        # they never print over each other.
        rule_values = [
            {"threshold": t, "label": f"{t:,}", "y": 8 + 12 * i} for i, t in enumerate(thresholds)
        ]
        base = alt.Chart(alt.Data(values=rule_values))
        layers.append(
            base.mark_rule(color="#333", strokeDash=[5, 3]).encode(
                x=alt.X("threshold:Q", scale=x_scale)
            )
        )
        layers.append(
            base.mark_text(align="right", dx=-4, fontSize=10, color="#333").encode(
                x=alt.X("threshold:Q", scale=x_scale),
                y=alt.Y("y:Q", scale=None, axis=None),
                text="label:N",
            )
        )
    chart = alt.layer(*layers).properties(width=640, height=300)
    shown_flagged = (
        f"all {n_flagged:,} flagged requests"
        if n_flagged <= FLAGGED_SAMPLE
        else f"{len(flagged):,} of {n_flagged:,} flagged requests (a sample by a hash of the"
        " request id)"
    )
    shown_plain = (
        f"all {n_plain:,} unflagged requests"
        if n_plain <= PLAIN_SAMPLE
        else f"a sample of {len(plain):,} of {n_plain:,} unflagged requests (by a hash of the"
        " request id)"
    )
    caption = (
        f"Shows {shown_flagged}, coloured by verdict with excluded traffic in grey, and"
        f" {shown_plain}. Dashed vertical lines: the prefill input limits"
        + (" (" + ", ".join(f"{t:,}" for t in thresholds) + " tokens)" if thresholds else "")
        + "; prompts at or above a node's limit should have been rejected."
    )
    if fit:
        caption += (
            f" Solid line: the TTFT latency_too_good expects for each length, fitted on this"
            f" case's unflagged traffic; dotted: {fit[2]:g} of it, below which a response is"
            " too fast."
        )
    else:
        caption += " No latency fit was flagged on, so no expected-TTFT curve is drawn."
    if ctx:
        caption += f" The axis ends at the context length ({ctx:,} tokens)"
        caption += (
            f"; {beyond:,} longer prompts (refused by the tokenizer) are not drawn."
            if beyond
            else "."
        )
    caption += " Both axes are logarithmic."
    if not thresholds:
        caption += " No input limit is known for this case, so no limit line is drawn."
    return Chart("chart-ttft", title, None, caption, _spec(_config(chart)))


def per_rank(con: duckdb.DuckDBPyConnection, data: ReportData) -> Chart:
    """Where victims and sources sat: per decode node and rank, the affected responses (by
    verdict) and the distinct earlier requests whose KV they read (counted in SQL)."""
    title = "Where affected responses and their sources sat (decode node / rank)"
    n_rows = data.counts["rows"]
    if not n_rows:
        return Chart("chart-nodes", title, None, "No affected responses: nothing to plot.")
    import altair as alt

    place = (
        "coalesce(decode_node, '(unknown)')"
        " || CASE WHEN dp_rank IS NOT NULL THEN ' / ' || dp_rank ELSE '' END"
    )
    victims = [
        {"place": n, "verdict": v, "rank": _RANK[v], "responses": c}
        for n, v, c in con.execute(
            f"""SELECT {place} AS place, {_CATEGORY_SQL} AS category, count(*)
                FROM findings_affected GROUP BY place, category ORDER BY place, category"""
        ).fetchall()
    ]
    sources = dict(
        con.execute(
            f"""SELECT a.place, count(DISTINCT e.source_request_id)
                FROM findings_exposures e
                JOIN (SELECT request_id, {place} AS place FROM findings_affected) a
                  ON a.request_id = e.recipient_request_id
                WHERE notified_confidence(e.confidence)
                GROUP BY a.place ORDER BY a.place"""
        ).fetchall()
    )
    source_values = [{"place": n, "sources": c} for n, c in sources.items()]
    verdicts = [v for v in VERDICT_COLORS if any(r["verdict"] == v for r in victims)]
    places: list[str] = sorted({str(r["place"]) for r in victims} | set(sources))
    height = max(60, 22 * len(places))
    stack_max = max(_stack_totals(victims, "place").values())
    left = (
        alt.Chart(alt.Data(values=victims))
        .mark_bar()
        .encode(
            y=alt.Y("place:N", title="decode node / rank", sort=places),
            x=alt.X("sum(responses):Q", title="affected responses", axis=_count_axis(stack_max)),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=verdicts, range=[VERDICT_COLORS[v] for v in verdicts]),
                sort=verdicts,
            ),
            order=alt.Order("rank:Q"),
        )
        .properties(width=300, height=height)
    )
    right = (
        alt.Chart(alt.Data(values=source_values or [{"place": places[0], "sources": 0}]))
        .mark_bar(color="#0b4f8a")
        .encode(
            y=alt.Y("place:N", sort=places, axis=alt.Axis(labels=False, title=None)),
            x=alt.X("sources:Q", title="earlier requests read (page-level)"),
        )
        .properties(width=260, height=height)
    )
    chart = alt.hconcat(left, right)
    notified = data.counts["affected"] + data.counts["affected_excluded"]
    caption = (
        f"{n_rows} responses with a verdict ({notified} confirmed or likely) on"
        f" {len(places)} decode node / rank pairs; excluded traffic in grey whatever its"
        " verdict. Right: the distinct earlier requests whose KV page-level attribution says"
        " they read there."
    )
    return Chart("chart-nodes", title, None, caption, _spec(_config(chart)))


def build_charts(con: duckdb.DuckDBPyConnection, data: ReportData) -> list[Chart]:
    """Every chart of the report, in display order, with its spec; :func:`draw` draws them."""
    return [affected_over_time(con, data), tokens_vs_ttft(con, data), per_rank(con, data)]
