"""Progress callbacks of detection, attribution and the report: each step is told before it
runs, in order, and the library never prints."""

from __future__ import annotations

from fixtures.findings.builder import build

from forensics.case import load_case
from forensics.db import connect
from forensics.detect import detect_case
from forensics.detectors import load_detectors
from forensics.ingest import ingest_case
from forensics.report import write_report


def test_detection_tells_each_step_each_detector_and_each_decode_rank(tiny_case_dir, capfd):
    case = load_case(tiny_case_dir / "case.toml")
    ingest_case(case)
    con = connect(case.database)
    calls: list[tuple[str, int, int]] = []
    detect_case(con, case, progress=lambda *step: calls.append(step))
    detectors = [d.id for d in load_detectors()]
    assert [c for c in calls if c[0].startswith("Detector ")] == [
        (f"Detector {d}", i, len(detectors)) for i, d in enumerate(detectors)
    ]
    ranks = con.execute(
        "SELECT DISTINCT node, dp_rank FROM findings_attribution WHERE node IS NOT NULL "
        "ORDER BY node, dp_rank"
    ).fetchall()
    con.close()
    attribution = [c for c in calls if c[0].startswith("Attribution: ")]
    assert ranks, "the tiny case has affected responses on decode ranks"
    assert attribution == [
        (f"Attribution: replaying {node} rank {rank}", i, len(ranks))
        for i, (node, rank) in enumerate(ranks)
    ]
    assert calls[0] == ("Preparing the working views", 0, 0)
    assert calls[-4:] == [
        ("Evidence basis", 0, 4),
        ("Exploitation assessment", 1, 4),
        ("Log coverage", 2, 4),
        ("Summarising the traffic for the report", 3, 4),
    ]
    assert capfd.readouterr() == ("", "")


def test_the_report_tells_each_part_in_order(tmp_path, capfd):
    case, con = build(tmp_path / "case")
    calls: list[tuple[str, int, int]] = []
    write_report(con, case, tmp_path / "out", progress=lambda *step: calls.append(step))
    con.close()
    assert [c[1:] for c in calls] == [(i, 7) for i in range(7)]
    assert [c[0] for c in calls] == [
        "Reading the findings",
        "Writing the CSVs and the timeline (the charts are drawn beside)",
        "Writing the notices and findings/*.parquet",
        "Drawing the charts",
        "Writing report.html",
        "Writing report.md",
        "Writing manifest.json",
    ]
    assert capfd.readouterr() == ("", "")
