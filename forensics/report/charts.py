"""Charts for the report: altair specs rendered offline to inline SVG by vl-convert.

Every chart is a :class:`Chart` with an SVG (or None when there is nothing to draw) and a
caption that says what is shown, so the template can fall back to a sentence. Specs use UTC
scales (the rendering host's time zone must not change the picture) and no selections (altair
numbers those per process, which would make two renders differ).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from forensics.report.data import NOTIFIED, iso, utc

if TYPE_CHECKING:
    import duckdb

    from forensics.report.data import ReportData

UNFLAGGED_SAMPLE = 1500
VERDICT_COLORS = {
    "confirmed": "#b2182b",
    "likely": "#ef8a62",
    "possible": "#67a9cf",
    "excluded traffic": "#9e9e9e",
}


_RANK = {v: i for i, v in enumerate(VERDICT_COLORS)}


def _category(row: dict) -> str:
    # Excluded traffic (researcher, our tests) is most of a typical incident's hits; drawing it
    # apart keeps the customer impact readable at a glance.
    return "excluded traffic" if row["excluded_by"] else row["verdict"]


_FONT = "Helvetica, Arial, sans-serif"


@dataclass(frozen=True)
class Chart:
    """One figure of the report.

    Attributes:
        id: HTML id of the figure.
        title: heading.
        svg: inline SVG markup, or None when there is no data.
        caption: what the figure shows (or why it is empty).
    """

    id: str
    title: str
    svg: str | None
    caption: str


def _to_svg(chart) -> str:
    import vl_convert

    svg = vl_convert.vegalite_to_svg(chart.to_dict())
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


def affected_over_time(data: ReportData) -> Chart:
    """Stacked bars of affected responses per time bucket, by verdict."""
    title = "Affected responses over time"
    rows = [a for a in data.affected if a["received_at"] is not None]
    if not rows:
        return Chart("chart-over-time", title, None, "No affected responses: nothing to plot.")
    import altair as alt

    start, end = rows[0]["received_at"], rows[-1]["received_at"]
    size, label = _bucket(end - start)
    epoch = start.replace(hour=0, minute=0, second=0, microsecond=0)
    counts: dict[tuple[str, str], int] = {}
    for a in rows:
        slot = epoch + size * ((a["received_at"] - epoch) // size)
        key = (iso(slot), _category(a))
        counts[key] = counts.get(key, 0) + 1
    values = [
        {"bucket": b, "end": iso(utc(b) + size), "verdict": v, "rank": _RANK[v], "responses": n}
        for (b, v), n in sorted(counts.items())
    ]
    verdicts = [v for v in VERDICT_COLORS if any(r["verdict"] == v for r in values)]
    stack_max = max(_stack_totals(values, "bucket").values())
    chart = (
        alt.Chart(alt.Data(values=values))
        .mark_bar(stroke="white", strokeWidth=0.5)
        .encode(
            # x..x2 spans the whole bucket, so a sparse incident still shows readable bars.
            x=alt.X(
                "bucket:T",
                title=f"received (UTC, per {label})",
                scale=alt.Scale(type="utc"),
                axis=alt.Axis(format="%Y-%m-%d %H:%M", labelAngle=-30),
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
        .properties(width=640, height=220)
    )
    caption = (
        f"{len(rows)} responses with a verdict, counted per {label} of arrival (UTC); "
        "excluded traffic in grey whatever its verdict."
    )
    return Chart("chart-over-time", title, _to_svg(_config(chart)), caption)


def tokens_vs_ttft(con: duckdb.DuckDBPyConnection, data: ReportData) -> Chart:
    """Prompt tokens against time to first token, threshold lines and flagged points marked."""
    title = "Prompt tokens against time to first token"
    flagged = {a["request_id"]: a["verdict"] for a in data.affected}
    rows = con.execute(
        """SELECT request_id, prompt_tokens,
                  coalesce(ttft_ms, epoch_ms(first_token_at) - epoch_ms(received_at)) AS ttft
           FROM requests
           WHERE prompt_tokens > 0
             AND coalesce(ttft_ms, epoch_ms(first_token_at) - epoch_ms(received_at)) > 0
           ORDER BY md5(request_id), request_id"""
    ).fetchall()
    if not rows:
        return Chart(
            "chart-ttft",
            title,
            None,
            "No request has both prompt tokens and a time to first token: nothing to plot.",
        )
    import altair as alt

    marked = [r for r in rows if r[0] in flagged]
    plain = [r for r in rows if r[0] not in flagged]
    # Ordered by md5 of the id: a deterministic sample that is not biased by time or tenant.
    shown = plain[:UNFLAGGED_SAMPLE]
    values = [
        {"prompt_tokens": p, "ttft_ms": round(float(t), 3), "verdict": "not flagged"}
        for _, p, t in sorted(shown, key=lambda r: r[0])
    ] + [
        {"prompt_tokens": p, "ttft_ms": round(float(t), 3), "verdict": flagged[rid]}
        for rid, p, t in sorted(marked, key=lambda r: r[0])
    ]
    domain = ["not flagged"] + [
        v for v in VERDICT_COLORS if any(m[0] in flagged and flagged[m[0]] == v for m in marked)
    ]
    colors = ["#bbbbbb"] + [VERDICT_COLORS[v] for v in domain[1:]]
    points = (
        alt.Chart(alt.Data(values=values))
        .mark_point(filled=True, size=28, opacity=0.75)
        .encode(
            x=alt.X("prompt_tokens:Q", title="prompt tokens (log)", scale=alt.Scale(type="log")),
            y=alt.Y(
                "ttft_ms:Q", title="time to first token, ms (log)", scale=alt.Scale(type="log")
            ),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=domain, range=colors),
                sort=domain,
                title="verdict",
            ),
            shape=alt.Shape(
                "verdict:N", scale=alt.Scale(domain=domain), sort=domain, title="verdict"
            ),
        )
    )
    thresholds = sorted({a["threshold_tokens"] for a in data.affected if a["threshold_tokens"]})
    if not thresholds:
        thresholds = sorted(
            r[0]
            for r in con.execute(
                "SELECT DISTINCT max_req_input_len FROM pool_snapshots "
                "WHERE max_req_input_len IS NOT NULL"
            ).fetchall()
        )
    layers = [points]
    if thresholds:
        # Limits can sit close together on a log axis: stagger their labels down the plot so
        # they never print over each other.
        rule_values = [
            {"threshold": t, "label": f"{t:,}", "y": 8 + 12 * i} for i, t in enumerate(thresholds)
        ]
        base = alt.Chart(alt.Data(values=rule_values))
        layers.append(base.mark_rule(color="#333", strokeDash=[5, 3]).encode(x="threshold:Q"))
        layers.append(
            base.mark_text(align="right", dx=-4, fontSize=10, color="#333").encode(
                x="threshold:Q", y=alt.Y("y:Q", scale=None, axis=None), text="label:N"
            )
        )
    chart = alt.layer(*layers).properties(width=640, height=300)
    parts = [f"{len(marked)} flagged requests (coloured by verdict)"]
    if len(plain) > len(shown):
        parts.append(
            f"a deterministic sample of {len(shown):,} of {len(plain):,} unflagged requests "
            "(chosen by a hash of the request id)"
        )
    else:
        parts.append(f"all {len(plain):,} unflagged requests")
    caption = (
        "Shows " + " and ".join(parts) + ". Dashed lines: the prefill input limits "
        "(max_req_input_len) in force at some time"
        + (" (" + ", ".join(f"{t:,}" for t in thresholds) + " tokens)" if thresholds else "")
        + "; prompts at or above a node's limit should have been rejected. "
        "Both axes are logarithmic."
    )
    if not thresholds:
        caption += " No input limit is known for this case, so no line is drawn."
    return Chart("chart-ttft", title, _to_svg(_config(chart)), caption)


def per_node(data: ReportData) -> Chart:
    """Affected responses per decode node, by verdict."""
    title = "Affected responses per decode node"
    if not data.affected:
        return Chart("chart-nodes", title, None, "No affected responses: nothing to plot.")
    import altair as alt

    counts: dict[tuple[str, str], int] = {}
    for a in data.affected:
        key = (a["decode_node"] or "(unknown)", _category(a))
        counts[key] = counts.get(key, 0) + 1
    values = [
        {"node": n, "verdict": v, "rank": _RANK[v], "responses": c}
        for (n, v), c in sorted(counts.items())
    ]
    verdicts = [v for v in VERDICT_COLORS if any(r["verdict"] == v for r in values)]
    nodes = sorted({r["node"] for r in values})
    stack_max = max(_stack_totals(values, "node").values())
    chart = (
        alt.Chart(alt.Data(values=values))
        .mark_bar()
        .encode(
            y=alt.Y("node:N", title="decode node", sort=nodes),
            x=alt.X("sum(responses):Q", title="responses", axis=_count_axis(stack_max)),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=verdicts, range=[VERDICT_COLORS[v] for v in verdicts]),
                sort=verdicts,
            ),
            order=alt.Order("rank:Q"),
        )
        .properties(width=560, height=max(60, 24 * len(nodes)))
    )
    notified = sum(1 for a in data.affected if a["verdict"] in NOTIFIED)
    caption = (
        f"{len(data.affected)} responses with a verdict on {len(nodes)} decode nodes "
        f"({notified} confirmed or likely); excluded traffic in grey whatever its verdict."
    )
    return Chart("chart-nodes", title, _to_svg(_config(chart)), caption)


def build_charts(con: duckdb.DuckDBPyConnection, data: ReportData) -> list[Chart]:
    """Every chart of the report, in display order."""
    return [affected_over_time(data), tokens_vs_ttft(con, data), per_node(data)]
