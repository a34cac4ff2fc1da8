"""Report outputs: the postmortem (HTML and Markdown), CSVs, customer notices and a manifest.

Modules: ``data`` reads the findings once in stable orders, ``redact`` makes keyed pseudonyms,
``charts`` renders inline SVG, ``notices`` builds per-tenant notices, ``render`` holds the
Jinja2 environment and ``outputs`` writes the files.
"""

from forensics.report.outputs import ReportResult, write_report

__all__ = ["ReportResult", "write_report"]
