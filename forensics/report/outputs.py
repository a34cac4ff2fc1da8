"""Write the report outputs the README lists, byte for byte reproducible."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics import __version__
from forensics.errors import ForensicsError
from forensics.files import (
    BatchedWrites,
    private_dirs,
    remove_partials,
    sync_dir,
    write_atomic,
)
from forensics.report.csvsql import FORMULA_START, NUMBER, csv_chunks
from forensics.report.data import (
    AFFECTED_ORDER,
    AFFECTED_ROWS_SQL,
    EXPOSURE_ORDER,
    EXPOSURE_ROWS_SQL,
    all_tenant_ids,
    generation_time,
    iso,
    load_report_data,
)
from forensics.report.exports import timesketch_jsonl, write_findings_parquet
from forensics.report.redact import Redactor, resolve_key

if TYPE_CHECKING:
    import duckdb

    from forensics.case import Case
    from forensics.progress import StepProgress
    from forensics.scope import Scope

# The two outputs that grow with the incident, written by the database (forensics.report.csvsql):
# each column with what it holds.
AFFECTED_COLUMNS = (
    ("request_id", "text"),
    ("tenant_id", "tenant"),
    ("received_at", "time"),
    ("prompt_tokens", "int"),
    ("threshold_tokens", "int"),
    ("verdict", "text"),
    ("signals", "text"),
    ("excluded_by", "text"),
)
EXPOSURE_COLUMNS = (
    ("recipient_request_id", "text"),
    ("recipient_tenant_id", "tenant"),
    ("source_request_id", "text"),
    ("source_tenant_id", "tenant"),
    ("method", "text"),
    ("tokens", "int"),
    ("confidence", "text"),
)
NOTIFICATION_COLUMNS = ("tenant_id", "role", "responses", "first_at", "last_at", "confidence")
REVIEW_COLUMNS = (*NOTIFICATION_COLUMNS, "reason", "evidence")
EXPLOITATION_COLUMNS = (
    "tenant_id",
    "level",
    "score",
    "over_limit_attempts",
    "affected_responses",
    "excluded_by",
    "reasons",
)


@dataclass
class ReportResult:
    """What :func:`write_report` wrote.

    Attributes:
        out_dir: the output folder.
        files: every file written, manifest.json last.
        notices: the notice files (empty in redacted mode).
        redacted: whether tenant ids were pseudonymised.
        generated_at: the as-of time printed in the outputs.
        summary: headline counts (affected, recipients, sources, ...) and ``conclusion``.
        messages: things the user should be told (e.g. notices skipped when redacting).
    """

    out_dir: Path
    files: list[Path]
    notices: list[Path]
    redacted: bool
    generated_at: datetime
    summary: dict[str, Any]
    messages: list[str] = field(default_factory=list)


# A spreadsheet reads a cell that begins with one of FORMULA_START as a formula (OWASP, CSV
# injection); tenant ids and user agents come from the logs, so anyone can choose them. The
# database's CSV lines apply the same guard (forensics.report.csvsql).
_NUMBER = re.compile(NUMBER)


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell no spreadsheet runs: text that begins like a formula gets a
    leading single quote; numbers (negative ones too) stay numbers.

    >>> csv_cell("=1+2"), csv_cell("@SUM(A1)"), csv_cell("-1"), csv_cell(-1), csv_cell("a=b")
    ("'=1+2", "'@SUM(A1)", '-1', -1, 'a=b')
    """
    if value is None:
        return ""
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, str) and value.startswith(FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def _csv(columns: tuple[str, ...], rows: Iterable[dict]) -> str:
    """A small CSV output (one row per tenant or per rule): a header, then the rows with every
    cell through :func:`csv_cell`. The large ones are written by the database
    (:mod:`forensics.report.csvsql`), to the same bytes."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([csv_cell(row[c]) for c in columns])
    return buf.getvalue()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write(path: Path, text: str | Iterable[str], written: list[Path]) -> None:
    """Write one output: private, and complete or not at all (see :mod:`forensics.files`).

    ``text`` may come in chunks as it is made (a large CSV), so an output never has to fit in
    memory whole. It is encoded as it is ("\n" on every platform), so the bytes and hashes
    never depend on the platform.
    """
    private_dirs(path.parent)
    chunks = [text] if isinstance(text, str) else text
    write_atomic(path, (chunk.encode("utf-8") for chunk in chunks))
    written.append(path)


def _clear_findings(folder: Path) -> None:
    # Parquet copies of an earlier run may be unredacted: the folder holds this run's only.
    if folder.is_dir():
        for old in folder.glob("*.parquet"):
            old.unlink()


def _clear_notices(folder: Path) -> None:
    # Notices from an earlier run may name tenants no longer notified (or be unredacted copies
    # in a folder about to be shared): the folder holds exactly this run's notices.
    if folder.is_dir():
        for old in [*folder.glob("*.md"), *folder.glob("*.csv")]:
            try:
                old.unlink()
            except OSError as exc:
                raise ForensicsError(
                    f"{old}: cannot remove an earlier notice ({exc.strerror or exc})"
                ) from None


def write_report(
    con: duckdb.DuckDBPyConnection,
    case: Case,
    out_dir: str | Path,
    *,
    as_of: datetime | None = None,
    redact: bool = False,
    redact_key: str | None = None,
    progress: StepProgress | None = None,
) -> ReportResult:
    """Render every report output from the findings of a case.

    Args:
        con: the case database, with the findings and scope written by detection.
        case: the case manifest.
        out_dir: output folder (created with its parents when missing).
        as_of: the generation time printed in the outputs; default the manifest's ``as_of``,
            else its ``end``, else the latest evidence timestamp. Never the clock.
        redact: replace tenant ids by keyed pseudonyms and skip the notices.
        redact_key: the HMAC key; default ``$FORENSICS_REDACT_KEY``.
        progress: told of each part of the report before it is made.

    Returns:
        The paths written and the headline counts.

    Raises:
        ForensicsError: no findings, no redaction key, or no way to tell the generation time.
    """
    from concurrent.futures import ThreadPoolExecutor

    from forensics.report.charts import build_charts, draw
    from forensics.report.render import environment, report_context
    from forensics.scope import load_scope

    steps = [
        "Reading the findings",
        "Writing the CSVs and the timeline (the charts are drawn beside)",
        "Removing earlier notices (a redacted report has none)"
        if redact
        else "Writing the notices and findings/*.parquet",
        "Drawing the charts",
        "Writing report.html",
        "Writing report.md",
        "Writing manifest.json",
    ]

    def step(index: int) -> None:
        if progress:
            progress(steps[index], index, len(steps))

    # Detection wrote the findings and the scope together; the report only reads them.
    scope = load_scope(con)
    key = resolve_key(redact_key) if redact else None
    generated_at = generation_time(con, case, as_of)
    if generated_at is None:
        raise ForensicsError(
            f"{case.path.name}: cannot tell the report time: set [incident].as_of or end, "
            "or pass --as-of"
        )
    out = Path(out_dir)
    private_dirs(out)
    # manifest.json is written last and hashes every output: without it a folder is no
    # complete report. The previous one goes first, so that a run that stops half way (a
    # kill, a full disk) leaves a folder that does not pass for whole; temporary files such a
    # run left are removed.
    remove_partials(out)
    remove_partials(out / "notices")
    try:
        (out / "manifest.json").unlink(missing_ok=True)
    except OSError as exc:
        raise ForensicsError(
            f"{out / 'manifest.json'}: cannot replace the manifest ({exc.strerror or exc})"
        ) from None

    step(0)
    tenant_ids = all_tenant_ids(con)
    red = Redactor(tenant_ids, key)
    data = load_report_data(con, case, generated_at, red)
    env = environment()
    # The charts' data is read here; their SVG is drawn in a thread while this one writes the
    # other outputs: vl-convert draws outside the GIL, and drawing was a tenth to a sixth of
    # a report whose notices keep this thread busy. (Only the drawing: lazy imports in two
    # threads at once can find each other's modules half made.)
    specs = build_charts(con, data)
    charts = ThreadPoolExecutor(max_workers=1)
    try:
        drawn = charts.submit(draw, specs)
        written: list[Path] = []
        step(1)
        written += _write_exports(con, out, data, red)

        notices: list[Path] = []
        messages: list[str] = []
        step(2)
        _clear_notices(out / "notices")
        _clear_findings(out / "findings")
        if redact:
            messages.append(
                "Notices and findings/*.parquet were not written: they hold tenant ids"
                " unredacted. Run without --redact to write them."
            )
        else:
            written += write_findings_parquet(con, out / "findings")
            notices = write_notices(
                con,
                case,
                scope,
                out / "notices",
                generated_at=generated_at,
                window=data.window,
                tenant_ids=tenant_ids,
                env=env,
            )
            written += notices
        step(3)
        ctx = report_context(data, drawn.result(), __version__)
    finally:
        charts.shutdown(wait=True, cancel_futures=True)
    step(4)
    _write(out / "report.html", env.get_template("report.html").render(ctx), written)
    step(5)
    _write(out / "report.md", env.get_template("report.md.j2").render(ctx), written)

    step(6)
    manifest = _manifest(case, data, out, written, redact)
    sync_dir(out / "notices")
    _write(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n", written)
    sync_dir(out)
    summary = dict(data.summary)
    summary["conclusion"] = data.exploitation_summary["conclusion"]
    summary["level"] = data.exploitation_summary["level"]
    summary["basis_headline"] = data.basis.get("headline", "")
    # What the tenant counts cannot show (a tenant the logs do not name): said beside them.
    caveats = data.basis.get("caveats") or {}
    summary["notify_caveats"] = {k: caveats[k] for k in ("recipients", "sources") if caveats.get(k)}
    summary["coverage_level"] = data.coverage_summary["level"]
    summary["coverage_statement"] = data.coverage_summary["statement"]
    return ReportResult(out, written, notices, bool(redact), generated_at, summary, messages)


def _write_exports(con: duckdb.DuckDBPyConnection, out: Path, data, red: Redactor) -> list[Path]:
    """The CSVs and the timeline; the two that grow with the incident stream from the
    database in batches."""
    written: list[Path] = []
    _write(
        out / "affected_responses.csv",
        csv_chunks(con, AFFECTED_COLUMNS, AFFECTED_ROWS_SQL, AFFECTED_ORDER, red),
        written,
    )
    _write(
        out / "exposures.csv",
        csv_chunks(con, EXPOSURE_COLUMNS, EXPOSURE_ROWS_SQL, EXPOSURE_ORDER, red),
        written,
    )
    _write(out / "notifications.csv", _csv(NOTIFICATION_COLUMNS, data.notifications), written)
    _write(out / "review.csv", _csv(REVIEW_COLUMNS, data.review), written)
    exploitation = [
        x
        | {"over_limit_attempts": x["over_threshold_attempts"], "reasons": "; ".join(x["reasons"])}
        for x in data.exploitation
    ]
    _write(out / "exploitation.csv", _csv(EXPLOITATION_COLUMNS, exploitation), written)
    _write(out / "timeline.jsonl", timesketch_jsonl(con, data, red), written)
    return written


def write_notices(
    con: duckdb.DuckDBPyConnection,
    case: Case,
    scope: Scope,
    folder: Path,
    *,
    generated_at: datetime,
    window: dict[str, str],
    tenant_ids: set[str],
    env=None,
) -> list[Path]:
    """Write one notice per notified tenant into ``folder``; return the paths, sorted by tenant.

    Args:
        con: the case database.
        case: the case manifest (its id is quoted in every notice).
        scope: who is notified, in which roles.
        folder: the notices folder (created when missing).
        generated_at: the date printed on the notices.
        window: ``start`` and ``end`` of the exposure window (ISO strings, may be empty).
        tenant_ids: every tenant id of the case, scrubbed from the free text of other notices.
        env: a template environment (default: :func:`forensics.report.render.environment`).
    """
    from forensics.remediation import remediation_status
    from forensics.report.notices import Scrubber, assign_slugs, notice_contexts
    from forensics.report.render import environment, human_time

    template = (env or environment()).get_template("notice.md.j2")
    scrubber = Scrubber(tenant_ids | set(scope.tenants))
    fix = remediation_status(con, case)
    written: list[Path] = []
    slugs = assign_slugs(list(scope.tenants))
    private_dirs(folder)
    with BatchedWrites() as files:
        for tenant, ctx in notice_contexts(con, scope):
            slug = slugs[tenant]
            ctx.update(
                case_id=scrubber.scrub(case.id, tenant),
                generated_on=human_time(generated_at),
                window_start=human_time(window.get("start")) if window.get("start") else "",
                window_end=human_time(window.get("end")) if window.get("end") else "",
                csv_name=f"{slug}.csv",
                fix={
                    "fixed": fix.fixed,
                    "fixed_at": fix.fixed_at,
                    "basis": scrubber.scrub(fix.basis, tenant),
                    "last_affected_at": fix.last_affected_at,
                    "still_limited": bool(fix.still_limited),
                },
            )
            notice = template.render(ctx)
            for name, text in ((f"{slug}.md", notice), (f"{slug}.csv", _notice_csv(ctx))):
                files.write(folder / name, text.encode("utf-8"))
                written.append(folder / name)
    return written


def _notice_csv(ctx: dict[str, Any]) -> str:
    """Every request a notice concerns, one row each: the letter's tables, whole. Each row's
    line comes ready from the database (``csv_line``, :mod:`forensics.report.notices`): at
    hundreds of thousands of rows, formatting them here took a fifth of a report."""
    from forensics.report.notices import NOTICE_CSV_COLUMNS

    lines = [",".join(NOTICE_CSV_COLUMNS) + "\n"]
    for role in ("recipient", "source"):
        lines += [r["csv_line"] for r in (ctx.get(role) or {}).get("requests", [])]
    return "".join(lines)


def _manifest(case: Case, data, out: Path, written: list[Path], redact: bool) -> dict[str, Any]:
    try:
        manifest_sha = _sha256_file(case.path)
    except OSError:
        manifest_sha = None
    return {
        "tool": {"name": "kv-forensics", "version": __version__},
        "case": {
            "id": data.case_id,
            "manifest": case.path.name,
            "manifest_sha256": manifest_sha,
        },
        "generated_at": iso(data.generated_at),
        "redacted": bool(redact),
        "query_set_hash": data.case_facts.get("query_set_hash"),
        "detection_engine": data.case_facts.get("engine") or {"name": "duckdb"},
        "inputs": [_input(e) for e in data.evidence],
        "outputs": [
            {
                "path": p.relative_to(out).as_posix(),
                "sha256": _sha256_file(p),
                "bytes": p.stat().st_size,
            }
            for p in sorted(written, key=lambda p: p.relative_to(out).as_posix())
        ],
        "counts": {
            k: data.summary[k]
            for k in (
                "affected",
                "confirmed",
                "likely",
                "affected_excluded",
                "possible",
                "recipients",
                "sources",
                "exposures",
            )
        },
    }


def _input(e: dict[str, Any]) -> dict[str, Any]:
    """One ``inputs`` item of manifest.json: a file with its outcome, or a pattern that matched
    nothing. Files that failed and patterns have no rows (null); what did not load whole says
    why and how many rows were lost ("unknown" when the file does not say)."""
    item = {
        "path": e["path"],
        "kind": e["kind"],
        "format": e["format"],
        "sha256": e["sha256"],
        "bytes": e["bytes"],
        "rows_read": e["rows_read"],
        "rows": e["rows_loaded"],
        "rejects": e["rows_rejected"],
        "first_at": iso(e["first_at"]) or None,
        "last_at": iso(e["last_at"]) or None,
        "outcome": e["outcome"],
    }
    if e["outcome"] != "loaded":
        item["reason"] = e["reason"]
        item["rows_lost"] = "unknown" if e["rows_lost"] is None else e["rows_lost"]
        if e["entry"] is not None:
            item["entry"] = e["entry"]
    return item
