"""Report outputs on hand-built findings: structure, numbers, notices, redaction, determinism."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fixtures.findings.builder import (
    AFFECTED,
    FINDINGS_PARQUET,
    NOTIFIED_TENANTS,
    OUTPUT_FILES,
    REQUESTS,
    SECTIONS,
    XSS,
    build,
)
from typer.testing import CliRunner

from forensics.case import load_case
from forensics.cli import app
from forensics.errors import ForensicsError
from forensics.report import write_report
from forensics.report.notices import assign_slugs, tenant_slug

ALL_TENANTS = sorted({r[1] for r in REQUESTS})
ALL_REQUESTS = sorted(r[0] for r in REQUESTS)
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "source", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def text(self) -> str:
        parts = [c if isinstance(c, str) else c.text for c in self.children]
        return " ".join("".join(parts).split())

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag]

    def by_id(self, id_: str) -> Node:
        found = [n for n in self.iter() if n.attrs.get("id") == id_]
        assert len(found) == 1, f"expected one element with id {id_!r}, found {len(found)}"
        return found[0]

    def table(self) -> tuple[list[str], list[list[str]]]:
        head = [th.text for th in self.find_all("th")]
        body = [
            [td.text for td in tr.find_all("td")] for tr in self.find_all("tr") if tr.find_all("td")
        ]
        return head, body


class TreeBuilder(HTMLParser):
    """A small DOM from the standard library parser (tags, attributes, text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag == "br":
            self.cur.children.append(" ")
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        assert node is not None, f"stray </{tag}>"
        self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(html: str) -> Node:
    builder = TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def num(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    case, con = build(folder)
    out = folder / "deep" / "missing" / "out"
    result = write_report(con, case, out)
    html = (out / "report.html").read_text(encoding="utf-8")
    yield {
        "case": case,
        "con": con,
        "out": out,
        "result": result,
        "html": html,
        "dom": parse(html),
        "folder": folder,
    }
    con.close()


def test_writes_exactly_the_fixed_outputs_into_created_folders(report):
    out = report["out"]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    slugs = assign_slugs(NOTIFIED_TENANTS)
    notices = [f"notices/{s}.{ext}" for s in slugs.values() for ext in ("md", "csv")]
    assert files == sorted([*OUTPUT_FILES, *FINDINGS_PARQUET, *notices])
    assert report["result"].files[-1] == out / "manifest.json"


def test_csv_columns_are_the_contract(report):
    out = report["out"]
    assert read_csv(out / "affected_responses.csv")[0] == [
        "request_id",
        "tenant_id",
        "received_at",
        "prompt_tokens",
        "threshold_tokens",
        "verdict",
        "signals",
        "excluded_by",
    ]
    assert read_csv(out / "exposures.csv")[0] == [
        "recipient_request_id",
        "recipient_tenant_id",
        "source_request_id",
        "source_tenant_id",
        "method",
        "tokens",
        "confidence",
    ]
    assert read_csv(out / "notifications.csv")[0] == [
        "tenant_id",
        "role",
        "responses",
        "first_at",
        "last_at",
        "confidence",
    ]


def test_csv_rows_are_sorted_and_timestamps_are_utc_z(report):
    _, affected = read_csv(report["out"] / "affected_responses.csv")
    keys = [(r["received_at"], r["request_id"]) for r in affected]
    assert keys == sorted(keys)
    _, notes = read_csv(report["out"] / "notifications.csv")
    assert [(n["tenant_id"], n["role"]) for n in notes] == sorted(
        (n["tenant_id"], n["role"]) for n in notes
    )
    stamps = [r["received_at"] for r in affected] + [n["first_at"] for n in notes]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", s) for s in stamps)


def test_every_section_has_an_id_and_a_nav_link(report):
    dom = report["dom"]
    for section in SECTIONS:
        assert dom.by_id(section).tag == "section"
    navs = [n for n in dom.iter() if n.tag == "nav"]
    assert len(navs) == 1
    links = [a.attrs["href"] for a in navs[0].find_all("a")]
    assert links == [f"#{s}" for s in SECTIONS]


def test_summary_numbers_match_the_csvs(report):
    dom, out = report["dom"], report["out"]
    _, affected = read_csv(out / "affected_responses.csv")
    _, notes = read_csv(out / "notifications.csv")

    def value(fact: str) -> str:
        spans = [n for n in dom.by_id(fact).iter() if "value" in n.attrs.get("class", "")]
        return spans[0].text

    customer = [
        r for r in affected if r["verdict"] in ("confirmed", "likely") and not r["excluded_by"]
    ]
    assert num(value("fact-affected")) == len(customer) == 3
    # r-a1 read acct_beta's r-b1 and r-x1 read acct_internal's r-int0 (high); r-a2 only a
    # temporal candidate: 2 of the 3 read another tenant's data on page-level evidence.
    assert "2 of them read another tenant's data" in dom.by_id("fact-affected").text
    assert num(value("fact-recipients")) == sum(n["role"] == "recipient" for n in notes) == 2
    assert num(value("fact-sources")) == sum(n["role"] == "source" for n in notes) == 2
    assert sum(int(n["responses"]) for n in notes if n["role"] == "recipient") == len(customer)
    # Tenants to notify: distinct tenants of notifications.csv (alpha, XSS, beta, traversal),
    # of the 6 tenants with traffic no exclusion matched (alpha, beta, gamma, delta, XSS,
    # traversal).
    assert num(value("fact-notify")) == len({n["tenant_id"] for n in notes}) == 4
    assert "Of 6 customer tenants" in dom.by_id("fact-notify").text
    # First to last confirmed or likely response, excluded traffic included (r-a1 .. r-int1).
    notified = [r for r in affected if r["verdict"] in ("confirmed", "likely")]
    assert min(r["received_at"] for r in notified) == "2026-09-01T10:00:00Z"
    assert max(r["received_at"] for r in notified) == "2026-09-01T12:00:00Z"
    assert value("fact-exposure") == "1 September 2026, 10:00 UTC to 1 September 2026, 12:00 UTC"
    assert value("fact-window") == "2026-09-01T00:00:00Z to 2026-09-02T00:00:00Z"
    assert "researcher only" in value("fact-exploitation")
    assert value("fact-coverage") == "incomplete"
    for fact in (
        "fact-affected",
        "fact-notify",
        "fact-exposure",
        "fact-fix",
        "fact-recipients",
        "fact-sources",
        "fact-window",
        "fact-exploitation",
        "fact-coverage",
    ):
        basis = [n for n in dom.by_id(fact).iter() if n.attrs.get("class") == "basis"]
        assert basis and basis[0].text, f"{fact} has no basis"


def test_tenant_tables_match_notifications_csv(report):
    dom, out = report["dom"], report["out"]
    _, notes = read_csv(out / "notifications.csv")
    for role, table in (("recipient", "table-recipients"), ("source", "table-sources")):
        _, body = dom.by_id(table).table()
        assert [(r[0], num(r[1]), r[2], r[3], r[4]) for r in body] == [
            (n["tenant_id"], int(n["responses"]), n["first_at"], n["last_at"], n["confidence"])
            for n in notes
            if n["role"] == role
        ]
    _, excluded = dom.by_id("table-excluded-recipients").table()
    assert excluded == [["acct_internal", "internal", "1"], ["acct_researcher", "researcher", "2"]]
    _, review = dom.by_id("table-review").table()
    _, rows = read_csv(out / "review.csv")
    assert [(r[0], r[1], num(r[2]), r[5]) for r in review] == [
        (n["tenant_id"], n["role"], int(n["responses"]), n["confidence"]) for n in rows
    ]
    # acct_gamma: its only response is possible, and its data was named only by a temporal
    # candidate: both on the review list, neither notified.
    assert [(r[0], r[1], r[5]) for r in review] == [
        ("acct_gamma", "recipient", "possible"),
        ("acct_gamma", "source", "low"),
    ]


def test_methodology_lists_every_detector_with_parameters_and_hits(report):
    head, body = report["dom"].by_id("table-detectors").table()
    assert head[-1] == "Hits"
    assert [(r[0].split()[0], num(r[-1])) for r in body] == [
        ("over_pool", 6),
        ("prefill_rejected", 4),
        ("token_mismatch", 1),
        ("latency_too_good", 2),
        ("decode_rejected", 0),
    ]
    assert body[0][3] == "default_pool_tokens = 681280"
    _, methods = report["dom"].by_id("table-methods").table()
    assert methods == [["allocation_log", "1"], ["allocator_replay", "4"], ["temporal", "3"]]
    assert "kv_allocations missing" in report["dom"].by_id("warnings").text


def test_exclusions_exploitation_coverage_tables(report):
    dom = report["dom"]
    _, excl = dom.by_id("table-exclusions").table()
    assert [(r[0], num(r[3]), num(r[4]), num(r[5])) for r in excl] == [
        ("researcher", 2, 2, 1),
        ("internal", 2, 1, 1),
    ]
    _, expl = dom.by_id("table-exploitation").table()
    assert [(r[0], r[1]) for r in expl] == [("acct_researcher", "high"), ("acct_alpha", "low")]
    _, cov = dom.by_id("table-coverage").table()
    assert [(r[0], r[1], num(r[5])) for r in cov] == [
        ("client_only", "-", 0),
        ("node", "decode-1", 0),
        ("node", "decode-3", 1),
    ]


def test_timeline_has_manifest_and_derived_events(report):
    _, body = report["dom"].by_id("table-timeline").table()
    events = [(r[0], r[1], r[2]) for r in body]
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    assert (
        "2026-09-01T20:00:00Z",
        "manifest",
        "Report received through the bug bounty programme",
    ) in events
    assert (
        "2026-09-01T10:00:00Z",
        "findings",
        "First affected response (confirmed): request r-a1",
    ) in events
    assert any(e[2].startswith("Last affected response") and "r-int1" in e[2] for e in events)
    changes = [e for e in events if e[1] == "pool snapshots"]
    # prefill-1 changed once (15:00); the 10:30 snapshot repeated the same values.
    assert changes == [
        (
            "2026-09-01T15:00:00Z",
            "pool snapshots",
            "Configuration change on prefill-1: max_total_num_tokens 681,280 → 1,048,576, "
            "max_req_input_len 681,274 → 1,048,570",
        )
    ]


def test_evidence_table_matches_manifest_json(report):
    _, body = report["dom"].by_id("table-evidence").table()
    manifest = json.loads((report["out"] / "manifest.json").read_text())
    assert [(r[0], r[3], num(r[4]), num(r[5])) for r in body] == [
        (i["path"], i["sha256"], i["rows"], i["rejects"]) for i in manifest["inputs"]
    ]
    assert [i["path"] for i in manifest["inputs"]] == [
        "evidence/pool.jsonl",
        "evidence/requests.jsonl",
    ]


def test_manifest_hashes_every_output(report):
    out = report["out"]
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {o["path"]: o["sha256"] for o in manifest["outputs"]}
    on_disk = {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in out.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert listed == on_disk
    case_sha = hashlib.sha256(report["case"].path.read_bytes()).hexdigest()
    assert manifest["case"]["manifest_sha256"] == case_sha
    assert manifest["query_set_hash"] == "f" * 64
    assert manifest["tool"]["version"]
    assert manifest["generated_at"] == "2026-09-02T00:00:00Z"


def test_charts_are_inline_svg_with_captions(report):
    dom = report["dom"]
    for chart in ("chart-over-time", "chart-ttft", "chart-nodes"):
        fig = dom.by_id(chart)
        assert fig.tag == "figure"
        assert len(fig.find_all("svg")) == 1, chart
        assert fig.find_all("figcaption")[0].text
    caption = dom.by_id("chart-ttft").find_all("figcaption")[0].text
    assert "7 flagged" in caption and "all 9 unflagged" in caption


def test_page_is_self_contained(report):
    dom, html = report["dom"], report["html"]
    for tag in ("script", "link", "iframe", "object", "embed", "img", "base"):
        assert dom.find_all(tag) == [], tag
    urls = [
        v
        for n in dom.iter()
        for k, v in n.attrs.items()
        if v and (k in ("src", "href", "xmlns", "action") or "url(" in v)
    ]
    assert all(u.startswith("#") for u in urls), urls
    assert "://" not in html
    assert not any(k.startswith("on") for n in dom.iter() for k in n.attrs)


def test_hostile_tenant_id_renders_as_text(report):
    dom, html = report["dom"], report["html"]
    assert "<img src=x" not in html
    cells = [td.text for td in dom.by_id("table-recipients").find_all("td")]
    assert XSS in cells


def test_markdown_has_the_same_numbers_and_escapes_html(report):
    md = (report["out"] / "report.md").read_text(encoding="utf-8")
    assert "| Affected responses | 3 |" in md
    assert "| Recipient tenants | 2 |" in md
    assert "| Source tenants | 2 |" in md
    assert "| `<img src=x onerror=alert(1)>` | 1 |" in md  # a code span renders literally
    assert "\n<img" not in md
    for title in (
        "Executive summary",
        "Timeline",
        "Methodology",
        "Exclusions",
        "Affected tenants",
        "Exposed tenants",
        "Exploitation assessment",
        "Log coverage",
        "Charts",
        "Evidence manifest",
    ):
        assert f"\n## {title}" in md


def _other_ids(tenant: str) -> list[str]:
    own_requests = {r[0] for r in REQUESTS if r[1] == tenant}
    return [t for t in ALL_TENANTS if t != tenant] + [
        r for r in ALL_REQUESTS if r not in own_requests
    ]


def test_notices_hold_only_their_own_tenant(report):
    slugs = assign_slugs(NOTIFIED_TENANTS)
    for tenant, slug in slugs.items():
        text = (report["out"] / "notices" / f"{slug}.md").read_text(encoding="utf-8")
        assert tenant in text
        leaked = [x for x in _other_ids(tenant) if x in text]
        assert leaked == [], f"notice of {tenant!r} mentions {leaked}"


def test_notice_contents_by_role(report):
    notices = report["out"] / "notices"
    alpha = (notices / "acct_alpha.md").read_text()
    assert "| `r-a1` | 2026-09-01T10:00:00Z | 700,000 | confirmed |" in alpha
    assert "| `r-a2` | 2026-09-01T10:01:00Z | 690,000 | likely |" in alpha
    assert "exposed" not in alpha  # recipient only: no source section
    beta = (notices / "acct_beta.md").read_text()
    # r-b3 was read only by the researcher (excluded), r-b1 by acct_alpha: counted apart.
    assert "| `r-b3` | 2026-09-01T11:00:00Z | 0 | 1 |" in beta
    assert "| `r-b1` | 2026-09-01T09:05:00Z | 1 | 0 |" in beta
    assert "went to traffic that is not a customer's: Bug bounty reproduction traffic" in beta
    # r-a1 (replay, high) and r-res1 (allocation log): r-a2's temporal candidate is not counted.
    assert "- 1 response to other customers' requests read it" in beta
    assert "Responses you received" not in beta


@pytest.mark.parametrize(
    "tenant", ["../../etc/passwd", XSS, "", "...", "CON", "a/b\\c", "x" * 300, "ÄÖ", "acct_1"]
)
def test_slugs_are_safe_file_names(tenant):
    slug = tenant_slug(tenant)
    assert re.fullmatch(r"[a-z0-9_-]{1,64}", slug)
    assert slug not in ("con", "nul")


def test_slugs_never_collide():
    tenants = ["Acct", "acct", "ACCT", "a c c t", "a-c-c-t", "a/c/c/t", "a.c.c.t"]
    slugs = assign_slugs(tenants)
    assert len(set(slugs.values())) == len(tenants)
    assert slugs["acct"] == "acct"


def test_redacted_report_has_no_tenant_ids(tmp_path):
    case, con = build(tmp_path / "case")
    out = tmp_path / "out"
    write_report(con, case, out)  # unredacted first: its notices must not survive
    result = write_report(con, case, out, redact=True, redact_key="k1")
    assert result.notices == []
    assert any("Notices and findings/*.parquet were not written" in m for m in result.messages)
    assert not list((out / "findings").glob("*.parquet"))
    assert not list((out / "notices").glob("*.md"))
    for name in OUTPUT_FILES:
        text = (out / name).read_text(encoding="utf-8")
        # The HTML escapes "<", so check the escaped form of the hostile id too.
        for tenant in ALL_TENANTS + ["&lt;img src=x onerror=alert(1)&gt;"]:
            assert tenant not in text, f"{tenant!r} in {name}"
    _, notes = read_csv(out / "notifications.csv")
    assert all(re.fullmatch(r"tenant-[0-9a-f]{12}", n["tenant_id"]) for n in notes)
    assert "redaction-note" in (out / "report.html").read_text()
    assert json.loads((out / "manifest.json").read_text())["redacted"] is True


def sorted_items(row: dict) -> list:
    return sorted(row.items())


@pytest.mark.parametrize(
    ("name", "tenant_columns"),
    [
        ("affected_responses.csv", ("tenant_id",)),
        ("exposures.csv", ("recipient_tenant_id", "source_tenant_id")),
        ("notifications.csv", ("tenant_id",)),
    ],
)
def test_redacted_csvs_hold_the_same_rows_with_pseudonyms(tmp_path, name, tenant_columns):
    from forensics.report.redact import pseudonym

    case, con = build(tmp_path / "case")
    write_report(con, case, tmp_path / "plain")
    write_report(con, case, tmp_path / "red", redact=True, redact_key="k1")
    header, plain = read_csv(tmp_path / "plain" / name)
    red_header, red = read_csv(tmp_path / "red" / name)
    assert plain and red_header == header
    for row in plain:
        for column in tenant_columns:
            if row[column]:
                row[column] = pseudonym(row[column], b"k1")
    # The same rows, each once (notifications.csv is ordered by the id it shows).
    assert sorted(map(sorted_items, red)) == sorted(map(sorted_items, plain))


def test_pseudonyms_are_stable_per_key_and_differ_across_keys(tmp_path, monkeypatch):
    case, con = build(tmp_path / "case")
    write_report(con, case, tmp_path / "a", redact=True, redact_key="k1")
    monkeypatch.setenv("FORENSICS_REDACT_KEY", "k1")
    write_report(con, case, tmp_path / "b", redact=True)
    write_report(con, case, tmp_path / "c", redact=True, redact_key="k2")
    a, b, c = ((tmp_path / d / "notifications.csv").read_text() for d in "abc")
    assert a == b
    ids_a = {r["tenant_id"] for r in read_csv(tmp_path / "a" / "notifications.csv")[1]}
    ids_c = {r["tenant_id"] for r in read_csv(tmp_path / "c" / "notifications.csv")[1]}
    assert len(ids_a) == 4 and ids_a.isdisjoint(ids_c)


def test_redact_without_key_fails(tmp_path, monkeypatch):
    monkeypatch.delenv("FORENSICS_REDACT_KEY", raising=False)
    case, con = build(tmp_path / "case")
    with pytest.raises(ForensicsError, match="FORENSICS_REDACT_KEY"):
        write_report(con, case, tmp_path / "out", redact=True)
    con.close()
    result = CliRunner().invoke(app, ["report", str(case.path), "--redact"])
    assert result.exit_code == 1
    assert "--redact needs a key" in result.output
    assert not (tmp_path / "case" / "report").exists()


def test_same_case_gives_byte_identical_outputs(tmp_path):
    case, con = build(tmp_path / "case")
    write_report(con, case, tmp_path / "one")
    write_report(con, case, tmp_path / "two")
    one = {
        p.relative_to(tmp_path / "one"): p.read_bytes()
        for p in (tmp_path / "one").rglob("*")
        if p.is_file()
    }
    two = {
        p.relative_to(tmp_path / "two"): p.read_bytes()
        for p in (tmp_path / "two").rglob("*")
        if p.is_file()
    }
    assert one == two


def test_generation_time_precedence(tmp_path):
    from datetime import UTC, datetime

    from fixtures.findings.builder import CASE_TOML

    case, con = build(tmp_path / "a")
    flag = datetime(2026, 9, 30, 12, tzinfo=UTC)
    assert write_report(con, case, tmp_path / "o1", as_of=flag).generated_at == flag
    assert write_report(con, case, tmp_path / "o2").generated_at == datetime(2026, 9, 2, tzinfo=UTC)
    con.close()
    no_end = CASE_TOML.replace('end = "2026-09-02T00:00:00Z"\n', "")
    case, con = build(tmp_path / "b", case_toml=no_end)
    # Latest evidence timestamp: the last request (14:00).
    assert write_report(con, case, tmp_path / "o3").generated_at == datetime(
        2026, 9, 1, 14, tzinfo=UTC
    )


def test_empty_findings_render_sentences_instead_of_charts(tmp_path):
    case, con = build(tmp_path / "case", affected=[], exposures=[])
    out = tmp_path / "out"
    result = write_report(con, case, out)
    dom = parse((out / "report.html").read_text())
    assert dom.by_id("chart-over-time").find_all("svg") == []
    assert "nothing to plot" in dom.by_id("chart-over-time").text
    assert dom.by_id("chart-nodes").find_all("svg") == []
    assert result.notices == []
    assert "No customer received foreign data." in dom.by_id("table-recipients").text
    assert read_csv(out / "affected_responses.csv")[1] == []


def test_report_command_writes_beside_the_manifest(tmp_path):
    case, con = build(tmp_path / "case")
    con.close()
    result = CliRunner().invoke(app, ["report", str(case.path), "--as-of", "2026-09-03T00:00:00Z"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "case" / "report"
    assert (out / "report.html").is_file()
    assert json.loads((out / "manifest.json").read_text())["generated_at"] == (
        "2026-09-03T00:00:00Z"
    )
    assert "Affected responses: 3" in result.output
    assert "Notify: 2 recipient tenants, 2 source tenants." in " ".join(result.output.split())
    assert "Review: 2 entries in review.csv" in " ".join(result.output.split())
    # Holes in the logs qualify every figure: the console says so too.
    assert "Log coverage: Incomplete: 1 silences in a log" in " ".join(result.output.split())
    # Every tenant is named here, so no count is qualified.
    assert "Recipients: " not in result.output and "Sources: " not in result.output


def test_a_tenant_count_the_logs_cannot_complete_is_qualified_on_the_console(tmp_path):
    unknown = (
        "2 affected responses have only engine records, no client record: the tenant is"
        " unknown (review list)."
    )
    basis = {"rows": {}, "missing": [], "caveats": {"recipients": unknown}, "can_clear": True}
    case, con = build(tmp_path / "case", extra_facts={"evidence_basis": basis})
    con.close()
    result = CliRunner().invoke(app, ["report", str(case.path), "--as-of", "2026-09-03T00:00:00Z"])
    assert result.exit_code == 0, result.output
    lines = " ".join(result.output.split())
    assert "Notify: 2 recipient tenants" in lines
    assert f"Recipients: {unknown}" in lines
    assert "Sources: " not in lines


def test_complete_coverage_adds_no_console_line(tmp_path):
    case, con = build(
        tmp_path / "case",
        extra_facts={"coverage": {"level": "complete", "statement": "Complete for the window."}},
    )
    con.close()
    result = CliRunner().invoke(app, ["report", str(case.path)])
    assert result.exit_code == 0, result.output
    assert "Log coverage" not in result.output


def test_report_command_usage_and_data_errors(tmp_path):
    case, con = build(tmp_path / "case")
    con.close()
    bad = CliRunner().invoke(app, ["report", str(case.path), "--as-of", "yesterday"])
    assert bad.exit_code == 2
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "case.toml").write_text('[incident]\nid = "X"\n')
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "other" / "case.toml")])
    assert missing.exit_code == 1
    assert "no case database" in missing.output


def _copy_case(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.duckdb*", "report"))
    return dst / "case.toml"


TINY = Path(__file__).parent / "fixtures" / "tiny_case"


@pytest.mark.skipif(not (TINY / "case.toml").exists(), reason="tests/fixtures/tiny_case missing")
def test_run_end_to_end_on_the_tiny_case(tmp_path):
    manifest = _copy_case(TINY, tmp_path / "case")
    runner = CliRunner(env={"COLUMNS": "100"})
    first = runner.invoke(app, ["run", str(manifest)])
    assert first.exit_code == 0, first.output
    assert "Ingest: 4 files loaded: rows read 99, loaded 99, rejected 0." in first.output
    out = tmp_path / "case" / "report"
    assert f"Report: {out / 'report.html'}" in first.output.splitlines()  # not under the cwd
    for name in OUTPUT_FILES:
        assert (out / name).is_file(), name
    _, affected = read_csv(out / "affected_responses.csv")
    _, notes = read_csv(out / "notifications.csv")
    customer = [
        r for r in affected if r["verdict"] in ("confirmed", "likely") and not r["excluded_by"]
    ]
    assert customer, "the tiny case has customer-affected responses"
    assert f"Affected responses: {len(customer)}" in first.output
    assert {n["tenant_id"] for n in notes if n["role"] == "recipient"} == {
        r["tenant_id"] for r in customer
    }
    assert "acct_researcher" not in {n["tenant_id"] for n in notes}
    notices = sorted(p.stem for p in (out / "notices").glob("*.md"))
    assert notices == sorted({n["tenant_id"] for n in notes})
    manifest_json = json.loads((out / "manifest.json").read_text())
    assert {i["path"] for i in manifest_json["inputs"]} == {
        "requests.jsonl",
        "engine_legs.jsonl",
        "pool_snapshots.csv",
        "tenants.csv",
    }
    html = parse((out / "report.html").read_text())
    assert num(html.by_id("fact-recipients").find_all("span")[0].text) == len(
        [n for n in notes if n["role"] == "recipient"]
    )

    # Running again (evidence already loaded, detection re-run) gives the same bytes.
    second = runner.invoke(app, ["run", str(manifest), "--out", str(tmp_path / "again")])
    assert second.exit_code == 0, second.output
    assert second.output.startswith(
        "Ingest: nothing new: 4 files already loaded (same sha256), skipped.\n"
    )
    for path in out.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (tmp_path / "again" / path.relative_to(out)).read_bytes()


def test_run_end_to_end_on_a_simulated_case(tmp_path):
    simulate = pytest.importorskip("forensics.simulate")
    summary = simulate.simulate_case(tmp_path / "sim", requests=1500, seed=11)
    out = tmp_path / "nested" / "out"
    result = CliRunner(env={"COLUMNS": "100"}).invoke(
        app, ["run", str(summary.case_path), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    _, notes = read_csv(out / "notifications.csv")
    dom = parse((out / "report.html").read_text())
    assert num(dom.by_id("fact-sources").find_all("span")[0].text) == sum(
        n["role"] == "source" for n in notes
    )
    # With complete logs the simulator's own counts use the report's definitions and agree.
    assert summary.recipient_tenants == sum(n["role"] == "recipient" for n in notes)
    assert summary.source_tenants == sum(n["role"] == "source" for n in notes)
    for chart in ("chart-over-time", "chart-ttft", "chart-nodes"):
        assert dom.by_id(chart).find_all("svg"), chart
    # Every notified tenant has exactly one notice, and no notice names the researcher.
    notices = list((out / "notices").glob("*.md"))
    assert len(notices) == len({n["tenant_id"] for n in notes})
    assert not any("acct_researcher" in p.read_text() for p in notices)
    assert "customer tenants in the client log: " in (out / "report.md").read_text()


def test_the_report_reads_no_table_that_grows_with_the_traffic(tmp_path):
    # After detection the report reads the findings and the small evidence tables only: with
    # requests, engine_legs and kv_allocations emptied it writes the same bytes. (A detection
    # that ran where the evidence lies leaves the case database without them.)
    import duckdb

    simulate = pytest.importorskip("forensics.simulate")
    summary = simulate.simulate_case(
        tmp_path / "sim", requests=3000, seed=5, kv_allocations=True, probers=["sweep"]
    )
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(summary.case_path), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    case = load_case(summary.case_path)
    con = duckdb.connect(str(case.database))
    counts = {}
    for table in ("requests", "engine_legs", "kv_allocations"):
        counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        con.execute(f"DELETE FROM {table}")
    con.close()
    assert all(counts.values()), counts
    result = runner.invoke(app, ["report", str(summary.case_path), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert a == b and len(a) > 10
    for name in a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_engine_logs_alone_count_tenants_against_no_client_log(tmp_path):
    simulate = pytest.importorskip("forensics.simulate")
    summary = simulate.simulate_case(tmp_path / "sim", requests=1500, seed=11, fmt="sglang")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(summary.case_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("report.md", "report.html"):
        text = " ".join((out / name).read_text().split())
        assert "No client log names the customer tenants, so there is no total" in text, name
        assert "in the client log:" not in text, name


def test_exploitation_csv_lists_every_assessed_tenant_with_its_reasons(report):
    head, rows = read_csv(report["out"] / "exploitation.csv")
    assert head == [
        "tenant_id",
        "level",
        "score",
        "over_limit_attempts",
        "affected_responses",
        "excluded_by",
        "reasons",
    ]
    assert [(r["tenant_id"], r["level"], r["score"], r["excluded_by"]) for r in rows] == [
        ("acct_researcher", "high", "0.9", "researcher"),
        ("acct_alpha", "low", "0.1", ""),
    ]
    assert rows[0]["reasons"] == (
        "3 prompts above the input limit within 20 minutes; prompt text repeats a probe template"
    )
    listed = {
        o["path"] for o in json.loads((report["out"] / "manifest.json").read_text())["outputs"]
    }
    assert {"exploitation.csv", "review.csv"} <= listed


# --- incomplete evidence ---------------------------------------------------------------------

PARTIAL = "truncated gzip data after 512 bytes: any rows after line 2 are lost"
MISSING = "no file matches this pattern ([[evidence]] #2, kind engine_legs)"


def _incomplete(folder: Path):
    """The standard findings with the pool file partial, a failed file and an empty pattern."""
    case, con = build(folder)
    con.execute(
        "UPDATE evidence SET outcome = 'partial', problem = ?, rows_lost = NULL "
        "WHERE evidence_id = 2",
        [PARTIAL],
    )
    con.execute(
        "INSERT INTO evidence_failures (source, entry, path, file, kind, format, outcome, reason, "
        "sha256, bytes, rows_lost) VALUES "
        "('manifest', 2, 'legs/*.parquet', NULL, 'engine_legs', 'canonical', 'missing', ?, "
        "NULL, NULL, NULL), "
        "('manifest', 1, 'evidence/broken.parquet', ?, 'requests', 'canonical', 'failed', "
        "'cannot load the file (bad page)', ?, 640, 200)",
        [MISSING, str(folder / "evidence" / "broken.parquet"), "ef" * 32],
    )
    return case, con


def test_incomplete_evidence_is_listed_and_announced(tmp_path):
    case, con = _incomplete(tmp_path / "case")
    out = tmp_path / "out"
    write_report(con, case, out)
    con.close()
    dom = parse((out / "report.html").read_text(encoding="utf-8"))
    _, body = dom.by_id("table-evidence").table()
    assert [(r[0], r[8], r[9]) for r in body] == [
        ("evidence/broken.parquet", "failed: cannot load the file (bad page)", "200"),
        ("evidence/pool.jsonl", f"partial: {PARTIAL}", "unknown"),
        ("evidence/requests.jsonl", "loaded", "0"),
        ("legs/*.parquet", f"missing: {MISSING}", "unknown"),
    ]
    inputs = json.loads((out / "manifest.json").read_text())["inputs"]
    assert [
        (i["path"], i["outcome"], i.get("reason"), i.get("rows_lost"), i.get("entry"))
        for i in inputs
    ] == [
        ("evidence/broken.parquet", "failed", "cannot load the file (bad page)", 200, 1),
        ("evidence/pool.jsonl", "partial", PARTIAL, "unknown", None),
        ("evidence/requests.jsonl", "loaded", None, None, None),
        ("legs/*.parquet", "missing", MISSING, "unknown", 2),
    ]
    assert inputs[0]["sha256"] == "ef" * 32 and inputs[0]["rows"] is None
    assert inputs[3]["sha256"] is None and inputs[3]["bytes"] is None

    # The summary opens with the banner: what is missing and which conclusions it limits.
    summary = dom.by_id("summary")
    banner = dom.by_id("evidence-incomplete")
    assert banner.parent is summary
    assert banner.text.startswith(
        "The evidence is incomplete: 1 file is partial, 1 file failed to load and "
        "1 manifest pattern matched no file."
    )
    items = [li.text for li in banner.find_all("li")]
    assert items[0].startswith("evidence/broken.parquet (requests, failed, rows lost: 200)")
    assert items[0].endswith(
        "This limits the findings: affected responses, recipient tenants and source tenants "
        "may be undercounted."
    )
    assert items[1].startswith("evidence/pool.jsonl (pool_snapshots, partial, 3 rows loaded")
    assert "prefill limits fall back to the default pool size" in items[1]
    assert "a decode node's pool is replayed only from its first snapshot" in items[1]
    assert items[2].startswith("legs/*.parquet (engine_legs, missing, rows lost: unknown)")
    assert "attribution falls back" in items[2]

    md = (out / "report.md").read_text(encoding="utf-8")
    summary_md = md[md.index("## Executive summary") : md.index("| Finding |")]
    assert "> **The evidence is incomplete:** 1 file is partial, 1 file failed to load and" in (
        summary_md
    )
    assert "> - `evidence/pool.jsonl` (pool_snapshots, partial, 3 rows loaded, rows lost: " in (
        summary_md
    )
    evidence_md = md[md.index("## Evidence manifest") :]
    assert "| `legs/*.parquet` | engine_legs | canonical | - | - | - | missing: " in evidence_md


def test_complete_evidence_shows_no_banner(report):
    assert "evidence-incomplete" not in report["html"]
    assert "The evidence is incomplete" not in (report["out"] / "report.md").read_text()
    inputs = json.loads((report["out"] / "manifest.json").read_text())["inputs"]
    assert {i["outcome"] for i in inputs} == {"loaded"}
    assert all("reason" not in i and "rows_lost" not in i for i in inputs)


def test_redaction_scrubs_tenant_ids_from_evidence_reasons(tmp_path):
    case, con = build(tmp_path / "case")
    con.execute(
        "UPDATE evidence SET outcome = 'partial', problem = ? WHERE evidence_id = 1",
        ["truncated gzip data after 9 bytes near acct_beta: any rows after line 1 are lost"],
    )
    write_report(con, case, tmp_path / "out", redact=True, redact_key="k")
    for name in ("report.html", "report.md", "manifest.json"):
        assert "acct_beta" not in (tmp_path / "out" / name).read_text(encoding="utf-8"), name


def test_run_writes_every_output_then_exits_1_on_incomplete_evidence(tmp_path):
    from fixtures.damaged import ALLOC_CSV, damaged_tiny_case

    manifest = damaged_tiny_case(_copy_case(TINY, tmp_path / "case").parent)
    folder = manifest.parent
    size = (folder / "requests.jsonl.gz").stat().st_size
    runner = CliRunner(env={"COLUMNS": "100"})
    first = runner.invoke(app, ["run", str(manifest)])
    assert first.exit_code == 1
    out = folder / "report"
    for name in OUTPUT_FILES:
        assert (out / name).is_file(), name
    errors = [line for line in first.output.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: alloc-*.csv: no file matches this pattern ([[evidence]] #5, kind kv_allocations)",
        f"Error: requests.jsonl.gz: partial (24 rows loaded): truncated gzip data after {size:,} "
        "bytes: any rows after line 24 are lost",
    ]
    inputs = {i["path"]: i for i in json.loads((out / "manifest.json").read_text())["inputs"]}
    assert inputs["requests.jsonl.gz"]["outcome"] == "partial"
    assert inputs["requests.jsonl.gz"]["rows"] == 24
    assert inputs["alloc-*.csv"]["outcome"] == "missing"
    dom = parse((out / "report.html").read_text())
    assert "requests.jsonl.gz (requests, partial, 24 rows loaded" in (
        dom.by_id("evidence-incomplete").text
    )
    # The cut took req-103 of acct_charlie, an affected customer: the report is honest that
    # its counts may be short, and the notified tenants show why that matters.
    _, notes = read_csv(out / "notifications.csv")
    assert "acct_charlie" not in {n["tenant_id"] for n in notes if n["role"] == "recipient"}
    # `report` alone renders the same outputs and names the same gaps (ingest is what fails).
    again = runner.invoke(app, ["report", str(manifest), "--out", str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    assert "incomplete evidence: alloc-*.csv: no file matches this pattern" in again.output
    assert "incomplete evidence: requests.jsonl.gz: partial (24 rows loaded)" in again.output
    assert (tmp_path / "again" / "report.md").read_bytes() == (out / "report.md").read_bytes()

    # Repaired: the complete file and the allocation log are there, so the run is clean and
    # acct_charlie is back.
    import gzip

    full = (TINY / "requests.jsonl").read_bytes()
    (folder / "requests.jsonl.gz").write_bytes(gzip.compress(full))
    (folder / "alloc-1.csv").write_text(ALLOC_CSV)
    second = runner.invoke(app, ["run", str(manifest)])
    assert second.exit_code == 0, second.output
    assert "Error:" not in second.output
    inputs = json.loads((out / "manifest.json").read_text())["inputs"]
    assert {i["path"]: i["outcome"] for i in inputs} == {
        "alloc-1.csv": "loaded",
        "engine_legs.jsonl": "loaded",
        "pool_snapshots.csv": "loaded",
        "requests.jsonl.gz": "loaded",
        "tenants.csv": "loaded",
    }
    assert "evidence-incomplete" not in (out / "report.html").read_text()
    _, notes = read_csv(out / "notifications.csv")
    assert "acct_charlie" in {n["tenant_id"] for n in notes if n["role"] == "recipient"}


def test_timeline_export_is_timesketch_jsonl(report):
    lines = (report["out"] / "timeline.jsonl").read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    assert all({"message", "datetime", "timestamp_desc"} <= e.keys() for e in events)
    assert [e["datetime"] for e in events] == sorted(e["datetime"] for e in events)
    _, affected = read_csv(report["out"] / "affected_responses.csv")
    responses = [e for e in events if e["kind"] == "affected_response"]
    assert sorted(e["request_id"] for e in responses) == sorted(r["request_id"] for r in affected)
    first = next(e for e in responses if e["request_id"] == "r-a1")
    assert first["datetime"] == "2026-09-01T10:00:00Z"
    assert first["timestamp_desc"] == "Request received"
    assert first["message"].startswith("Affected response r-a1 to acct_alpha: confirmed")
    kinds = {e["kind"] for e in events}
    assert {"case_event", "configuration_change", "exclusion"} <= kinds
    exclusion = [e["message"] for e in events if e["kind"] == "exclusion"]
    assert any(m.startswith("Exclusion 'researcher' (Bug bounty") for m in exclusion)


def _timeline_by_python(con, data, red):
    """The timeline as the export defines it, made event by event in Python: affected
    responses in arrival order, sorted by (time, kind, message) keeping that order for ties,
    merged with the other events, an affected response first on equal keys."""
    import heapq

    from forensics.report.exports import _event_key, _other_events, affected_event, event_line

    rows = con.execute(
        """SELECT request_id, tenant_id, received_at, prompt_tokens, threshold_tokens, verdict,
                  signals, excluded_by
           FROM findings_affected WHERE received_at IS NOT NULL
           ORDER BY received_at, request_id"""
    ).fetchall()
    affected = [affected_event(r[0], red.tenant(r[1]), *r[2:]) for r in rows]
    affected.sort(key=_event_key)
    events = heapq.merge(affected, _other_events(con, data), key=_event_key)
    return "".join(event_line(e) for e in events)


@pytest.mark.parametrize("key", [None, b"k"], ids=["plain", "redacted"])
def test_timeline_lines_made_by_the_database_are_pythons(tmp_path, monkeypatch, key):
    """Each affected response's line is written by the database where its text needs no
    escaping, and by json.dumps where it does; either way the bytes and the order are those
    of the events made one by one in Python, whatever the ids hold."""
    from datetime import UTC, datetime

    from forensics.report import csvsql
    from forensics.report.data import all_tenant_ids, load_report_data
    from forensics.report.exports import timesketch_jsonl
    from forensics.report.redact import Redactor

    case, con = build(tmp_path / "case")
    tricky = ['q"q', "a\\b", "é,ü", "tab\there", "ctl\x01", "", "plain", "'", "\u2028", "😀"]
    at = [datetime(2026, 9, 1, 10, 0, 0, us, tzinfo=UTC) for us in (0, 500000, 1, 250000)]
    rows = []
    for i, text in enumerate(tricky * 2):
        rows.append(
            (
                f"r-t{i}" if i % 3 else f"r-{text}",
                None if i % 7 == 0 else text if i % 2 else f"acct_{text}",
                None if i == 7 else at[i % 4],
                None if i % 6 == 1 else 700000 + i,
                [None, 0, 655360][i % 3],
                None if i == 9 else "possible",
                text if i % 4 == 0 else "latency_too_good",
                [None, "", "researcher", text][i % 4],
            )
        )
    # Two responses alike in every word of their line: arrival order breaks the tie.
    rows += [("r-same", "acct_alpha", at[1], 5, 0, "possible", "x", None)] * 2
    con.executemany(
        """INSERT INTO findings_affected (request_id, tenant_id, received_at, prompt_tokens,
             threshold_tokens, verdict, signals, excluded_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )
    red = Redactor(all_tenant_ids(con), key)
    data = load_report_data(con, case, datetime(2026, 9, 12, tzinfo=UTC), red)
    monkeypatch.setattr(csvsql, "BATCH_LINES", 4)
    by_sql = "".join(timesketch_jsonl(con, data, red))
    assert by_sql == _timeline_by_python(con, data, red)
    timed = con.execute(
        "SELECT count(*) FROM findings_affected WHERE received_at IS NOT NULL"
    ).fetchone()[0]
    con.close()
    events = [json.loads(line) for line in by_sql.splitlines()]
    assert sum(e["kind"] == "affected_response" for e in events) == timed
    # No tenant and an empty one (a pseudonym when redacted) are both here.
    assert None in {e.get("tenant_id") for e in events}
    assert ("" in {e.get("tenant_id") for e in events}) is (key is None)
    # Both ways of writing a line are in use here.
    assert '\\"' in by_sql and "prompt of unknown length" in by_sql


def test_findings_are_written_as_parquet_beside_the_csvs(report):
    import duckdb

    path = report["out"] / "findings" / "findings_affected.parquet"
    rows = duckdb.sql(f"SELECT request_id, verdict FROM read_parquet('{path}')").fetchall()
    _, affected = read_csv(report["out"] / "affected_responses.csv")
    assert sorted(rows) == sorted((r["request_id"], r["verdict"]) for r in affected)
    listed = {
        o["path"] for o in json.loads((report["out"] / "manifest.json").read_text())["outputs"]
    }
    assert "findings/findings_exposures.parquet" in listed


def test_methodology_shows_each_case_level_tunable_with_its_default(tmp_path):
    from forensics.parameters import PARAMETERS

    case, con = build(
        tmp_path / "case", extra_facts={"parameters": {"exploitation_high_points": 2.0}}
    )
    out = tmp_path / "out"
    write_report(con, case, out)
    con.close()
    head, rows = (
        parse((out / "report.html").read_text(encoding="utf-8")).by_id("table-tuning").table()
    )
    assert head == ["Parameter", "Used by", "Meaning", "Value", "Default"]
    assert [r[0] for r in rows] == list(PARAMETERS)
    by_name = {r[0]: r for r in rows}
    assert by_name["exploitation_high_points"][3:] == ["2.0 (set)", "1.5"]
    assert by_name["exploitation_min_attempts"][3:] == ["3", "3"]
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "| `exploitation_high_points` | exploitation |" in markdown
    assert "| 2.0 (set) | 1.5 |" in markdown


def test_the_report_only_reads_the_case_database(tmp_path):
    """Scoping happened with detection: the report renders from a read-only connection, and
    the database file is byte for byte what it was."""
    import hashlib

    from forensics.db import connect

    case, con = build(tmp_path / "case")
    con.close()
    before = hashlib.sha256(case.database.read_bytes()).hexdigest()
    ro = connect(case.database, read_only=True)
    result = write_report(ro, case, tmp_path / "out")
    ro.close()
    assert (tmp_path / "out" / "manifest.json") in result.files
    assert hashlib.sha256(case.database.read_bytes()).hexdigest() == before


def test_large_outputs_stream_in_batches_with_the_same_bytes(tmp_path, monkeypatch):
    """affected_responses.csv, exposures.csv and timeline.jsonl stream from the database; the
    batch size never shows in the bytes, and within one second the timeline keeps the order
    of its written timestamps (a fraction sorts before the whole second)."""
    from forensics.report import csvsql

    case, con = build(tmp_path / "case")
    con.execute(
        """INSERT INTO findings_affected (request_id, tenant_id, received_at, prompt_tokens,
             verdict, signals) VALUES
           ('r-whole', 'acct_alpha', '2026-09-01T10:00:00Z', 700000, 'possible',
            'latency_too_good'),
           ('r-half', 'acct_alpha', '2026-09-01T10:00:00.5Z', 700000, 'possible',
            'latency_too_good')"""
    )
    names = ("affected_responses.csv", "exposures.csv", "timeline.jsonl")
    write_report(con, case, tmp_path / "whole")
    monkeypatch.setattr(csvsql, "BATCH_LINES", 1)
    write_report(con, case, tmp_path / "batched")
    con.close()
    for name in names:
        assert (tmp_path / "whole" / name).read_bytes() == (
            tmp_path / "batched" / name
        ).read_bytes()
    events = [
        json.loads(line)
        for line in (tmp_path / "whole" / "timeline.jsonl").read_text().splitlines()
    ]
    assert [e["datetime"] for e in events] == sorted(e["datetime"] for e in events)
    order = [e.get("request_id") for e in events if e.get("request_id") in ("r-whole", "r-half")]
    assert order == ["r-half", "r-whole"]
    rows = (tmp_path / "whole" / "affected_responses.csv").read_text().splitlines()
    assert len(rows) == 1 + len(AFFECTED) + 2


def test_an_exclusion_that_may_hide_customers_heads_the_summary(tmp_path):
    case, con = build(tmp_path / "case")
    warning = (
        "exclusion internal takes 1 affected response from 1 tenant its tenant_ids do not name"
        " (acct_alpha): they leave the customer counts and are not notified."
    )
    con.execute(
        "INSERT INTO findings_warnings VALUES ('exclusion_beyond_named_tenants', ?)", [warning]
    )
    out = tmp_path / "out"
    write_report(con, case, out)
    banner = parse((out / "report.html").read_text(encoding="utf-8")).by_id("summary")
    assert f"An exclusion may hide customers: {warning} See Exclusions." in banner.text
    md = (out / "report.md").read_text(encoding="utf-8")
    summary = md[md.index("## Executive summary") : md.index("| Finding |")]
    assert f"> **An exclusion may hide customers:** {warning}" in summary
    # Redacted, the tenants it names are pseudonyms like every other tenant id.
    write_report(con, case, out, redact=True, redact_key="k1")
    assert "acct_alpha" not in (out / "report.md").read_text(encoding="utf-8")
