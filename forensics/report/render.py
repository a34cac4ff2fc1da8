"""The Jinja2 environment and the template context of the report and notices.

HTML templates autoescape (every value from the logs is untrusted text) and every template runs
with ``StrictUndefined`` so a misspelt variable fails the render instead of printing nothing.
Markdown has no autoescape, so two filters do that job: ``code`` for identifiers (a code span
renders literally) and ``md`` for prose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.report.data import iso, utc

if TYPE_CHECKING:
    import jinja2

    from forensics.report.charts import Chart
    from forensics.report.data import ReportData


def num(value: Any) -> str:
    """Integers with thousands separators; floats to three decimals; None as a dash.

    >>> num(1048576), num(None), num(0.5), num(1200.0)
    ('1,048,576', '-', '0.5', '1,200')
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        # Up to three decimals, trailing zeros dropped: 1200.0 reads "1,200", 0.9 "0.9".
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return str(value)


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and the noun in the right number.

    >>> plural(1, "response"), plural(2, "response"), plural(3, "is", "are")
    ('1 response', '2 responses', '3 are')
    """
    return f"{num(count)} {word if count == 1 else (many or word + 's')}"


def md_text(value: Any) -> str:
    r"""Prose safe inside Markdown (and a Markdown table cell): no raw HTML, no cell breaks.

    Backslash escapes rather than HTML entities, so the file reads as text too: ``<`` (which
    could open a tag), ``&`` where it would start an entity, ``|`` and backticks. A ``>``
    mid-line is plain text in Markdown and stays as written.

    >>> print(md_text("<b>|x</b> & 681,280 -> 1,310,720 &amp;"))
    \<b>\|x\</b> & 681,280 -> 1,310,720 \&amp;
    """
    import re

    text = "" if value is None else str(value)
    text = text.replace("\\", "\\\\").replace("<", "\\<").replace("|", "\\|")
    text = text.replace("`", "\\`")
    text = re.sub(r"&(?=#?[0-9A-Za-z]+;)", r"\\&", text)
    return " ".join(text.split())


def md_code(value: Any) -> str:
    """An identifier as a Markdown code span, rendered literally whatever it contains.

    >>> md_code("acct_1"), md_code("a`b")
    ('`acct_1`', '`` a`b ``')
    """
    if value is None or value == "":
        return "-"
    text = " ".join(str(value).split()).replace("|", "\\|")
    if "`" in text:
        return f"`` {text} ``"
    return f"`{text}`"


def human_time(value: Any) -> str:
    """A UTC instant as people write it in a letter; ``-`` when unknown.

    >>> human_time("2026-09-09T19:40:00Z")
    '9 September 2026, 19:40 UTC'
    """
    dt = utc(value)
    if dt is None:
        return "-"
    return f"{dt.day} {dt.strftime('%B %Y, %H:%M')} UTC"


def params_text(params: dict) -> str:
    """Detector parameters as ``name = value`` pairs in name order.

    Strings are shown as written, so a regular expression reads as the detector uses it.

    >>> print(params_text({"b": "length (a|b)", "a": 0.5, "c": None}))
    a = 0.5, b = /length (a|b)/, c = not set
    """

    def show(value) -> str:
        if value is None:
            return "not set"
        if isinstance(value, str):
            return f"/{value}/" if "\\" in value or "(" in value else f'"{value}"'
        return json.dumps(value, sort_keys=True)

    return ", ".join(f"{k} = {show(v)}" for k, v in sorted(params.items()))


def environment(template_dir: Path | None = None) -> jinja2.Environment:
    """The report template environment (``reports/``, or ``template_dir`` when given)."""
    import jinja2

    from forensics.paths import reports_dir

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir or reports_dir())),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default=False),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        num=num,
        ts=iso,
        md=md_text,
        code=md_code,
        params=params_text,
        plural=plural,
        human=human_time,
    )
    return env


def report_context(data: ReportData, charts: list[Chart], tool_version: str) -> dict[str, Any]:
    """The context of ``report.html`` and ``report.md``.

    Args:
        data: the loaded (and possibly redacted) report data.
        charts: the rendered figures.
        tool_version: the version printed in the header.

    Returns:
        A dict with ``data``, ``s`` (summary counts), derived tables and ``charts``.
    """
    return {
        "data": data,
        "s": data.summary,
        "tool_version": tool_version,
        "generated_at": iso(data.generated_at),
        "recipients": [n for n in data.notifications if n["role"] == "recipient"],
        "sources": [n for n in data.notifications if n["role"] == "source"],
        "excluded_recipients": data.excluded_recipients,
        "charts": charts,
        "sections": [
            ("summary", "Executive summary"),
            ("timeline", "Timeline"),
            ("methodology", "Methodology"),
            ("exclusions", "Exclusions"),
            ("affected-tenants", "Affected tenants"),
            ("source-tenants", "Exposed tenants"),
            ("review", "Review list"),
            ("exploitation", "Exploitation"),
            ("coverage", "Log coverage"),
            ("charts", "Charts"),
            ("evidence", "Evidence"),
        ],
    }
