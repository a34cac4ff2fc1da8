"""A repeated event is kept once: later copies are rejected as exact or conflicting duplicates.

Requests are identified by request_id, engine legs by request, role, node and start, runs of KV
pages by request, node, rank, time, operation and first page (``forensics.schema.IDENTITY``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from forensics.cli import app
from forensics.db import connect
from forensics.ingest import ingest_file, ingest_paths

ROW = {
    "request_id": "r1",
    "tenant_id": "acct_a",
    "received_at": "2026-09-08T14:00:00Z",
    "prompt_tokens": 5,
    "http_status": 200,
}
TINY = Path(__file__).parent / "fixtures" / "tiny_case"


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rejects(con) -> list[tuple]:
    return con.execute(
        "SELECT path, source_row, column_name, reason FROM rejects ORDER BY evidence_id, source_row"
    ).fetchall()


def test_within_a_file_the_first_row_is_kept_and_repeats_are_rejected(tmp_path, memory_db):
    path = jsonl(
        tmp_path / "r.jsonl",
        [
            ROW,
            dict(ROW, request_id="r2"),
            ROW,
            dict(ROW, tenant_id="acct_b", prompt_tokens=900000),
        ],
    )
    result = ingest_file(memory_db, path, "requests")
    assert (result.rows_read, result.rows_loaded, result.rows_rejected) == (4, 2, 2)
    assert (result.duplicates, result.conflicts) == (1, 1)
    assert rejects(memory_db) == [
        (
            str(path),
            3,
            "request_id",
            f"exact duplicate: same content as {path}:1, which is loaded",
        ),
        (
            str(path),
            4,
            "request_id",
            f"conflicting duplicate: same request_id as {path}:1, which is loaded, "
            "but a different tenant_id, prompt_tokens",
        ),
    ]
    got = memory_db.execute(
        "SELECT request_id, tenant_id, source_row FROM requests ORDER BY 1"
    ).fetchall()
    assert got == [("r1", "acct_a", 1), ("r2", "acct_a", 2)]
    # The rejected rows keep their raw text: a conflicting copy is evidence to look at.
    raw = memory_db.execute("SELECT raw FROM rejects WHERE source_row = 4").fetchone()[0]
    assert json.loads(raw)["tenant_id"] == "acct_b"
    ev = memory_db.execute("SELECT rows_read, rows_loaded, rows_rejected FROM evidence")
    assert ev.fetchone() == (4, 2, 2)


def test_overlapping_files_load_each_request_once(tmp_path):
    first = jsonl(tmp_path / "a.jsonl", [ROW, dict(ROW, request_id="r2")])
    # The same requests written by another tool (CSV, other number and time forms), one new.
    second = tmp_path / "b.csv"
    with second.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["request_id", "tenant_id", "received_at", "prompt_tokens", "http_status"])
        out.writerow(["r2", "acct_a", "1788876000", "5.0", "200"])
        out.writerow(["r3", "acct_a", "2026-09-08 16:00:00+02:00", "5", "200"])
        out.writerow(["r1", "acct_a", "2026-09-08T14:00:00Z", "6", "200"])
    db = tmp_path / "case.duckdb"
    result = ingest_paths(db, [first, second], "requests")
    assert [(f.rows_read, f.rows_loaded, f.rows_rejected) for f in result.files] == [
        (2, 2, 0),
        (3, 1, 2),
    ]
    assert (result.duplicates, result.conflicts) == (1, 1)
    con = connect(db)
    assert [r[1:] for r in rejects(con)] == [
        (1, "request_id", f"exact duplicate: same content as {first}:2, which is loaded"),
        (
            3,
            "request_id",
            f"conflicting duplicate: same request_id as {first}:1, which is loaded, "
            "but a different prompt_tokens",
        ),
    ]
    assert con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone() == (
        3,
        3,
    )


def test_engine_legs_keep_retries_and_reject_repeats(tmp_path, memory_db):
    leg = {
        "request_id": "r1",
        "role": "decode",
        "node": "decode-0",
        "started_at": "2026-09-08T14:00:00Z",
        "reserved_tokens": 900000,
        "transferred_tokens": 1,
    }
    path = jsonl(
        tmp_path / "legs.jsonl",
        [
            leg,
            dict(leg, role="prefill", node="prefill-0"),
            dict(leg, started_at="2026-09-08T14:00:05Z"),  # retried: a leg of its own
            dict(leg, node="decode-1"),  # sent elsewhere: a leg of its own
            leg,  # the same line again
            dict(leg, transferred_tokens=900000),  # the same leg, told differently
        ],
    )
    result = ingest_file(memory_db, path, "engine_legs")
    assert (result.rows_loaded, result.duplicates, result.conflicts) == (4, 1, 1)
    assert [r[1:] for r in rejects(memory_db)] == [
        (5, "request_id", f"exact duplicate: same content as {path}:1, which is loaded"),
        (
            6,
            "request_id",
            f"conflicting duplicate: same request_id, role, node, started_at as {path}:1, "
            "which is loaded, but a different transferred_tokens",
        ),
    ]


def test_a_repeated_allocation_is_rejected(tmp_path, memory_db):
    path = tmp_path / "alloc.csv"
    path.write_text(
        "node,dp_rank,request_id,at,op,first_page,page_count\n"
        "decode-0,,r1,2026-09-08T14:00:00Z,alloc,0,10\n"
        "decode-0,,r1,2026-09-08T14:00:00Z,alloc,0,10\n"
        "decode-0,,r1,2026-09-08T14:00:00Z,alloc,40,6\n"
        "decode-0,,r1,2026-09-08T14:00:00Z,alloc,40,7\n"
        "decode-0,,r1,2026-09-08T14:00:09Z,free,0,10\n"
    )
    result = ingest_file(memory_db, path, "kv_allocations")
    # A missing rank is the same missing rank: the second line repeats the first. The third is
    # a second run of pages of the same allocation; the fourth tells that run differently.
    assert (result.rows_loaded, result.duplicates, result.conflicts) == (3, 1, 1)
    assert [r[1] for r in rejects(memory_db)] == [2, 4]


def _overlapping_case(tmp_path: Path) -> Path:
    """The tiny case with a second requests file repeating part of the first (an overlap of
    rotated logs) and one request told differently. It sorts after requests.jsonl, so it loads
    second: the first file's rows are the ones kept."""
    import shutil

    folder = tmp_path / "case"
    shutil.copytree(TINY, folder, ignore=shutil.ignore_patterns("*.duckdb*"))
    lines = (folder / "requests.jsonl").read_text().splitlines(keepends=True)
    changed = json.loads(lines[0]) | {"prompt_tokens": 999999}
    (folder / "requests.rotated.jsonl").write_text("".join(lines[20:]) + json.dumps(changed) + "\n")
    manifest = folder / "case.toml"
    manifest.write_text(
        manifest.read_text().replace('paths = ["requests.jsonl"]', 'paths = ["requests*.jsonl"]')
    )
    return manifest


def test_the_report_counts_each_request_once_and_shows_the_duplicates(tmp_path, tiny_reference):
    runner = CliRunner(env={"COLUMNS": "200"})
    clean = tiny_reference.parent

    manifest = _overlapping_case(tmp_path)
    ingest = runner.invoke(app, ["ingest", str(manifest)])
    assert ingest.exit_code == 0, ingest.output
    assert "rows read 111, loaded 99, rejected 12" in ingest.output
    assert (
        "Duplicates rejected: 11 exact duplicates of rows already loaded (the same event in "
        "overlapping files), 1 conflicting duplicate (an event already loaded, with different "
        "content: a retry logged twice, a replayed or edited log)."
    ) in " ".join(ingest.output.split())
    status = runner.invoke(app, ["status", str(manifest)])
    assert "exact duplicate" in status.output and "conflicting duplicate" in status.output

    run = runner.invoke(app, ["run", str(manifest)])
    assert run.exit_code == 0, run.output
    out, reference = manifest.parent / "report", clean / "report"
    # Nothing is counted twice: the findings are those of the case without the overlap.
    for name in ("affected_responses.csv", "exposures.csv", "notifications.csv", "review.csv"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    html = (out / "report.html").read_text()
    assert (
        "Duplicates: 11 rows were exact duplicates of a row already loaded (the same event in "
        "overlapping log files) and 1 row repeats an event already loaded with different "
        "content. The first row loaded is kept; no event is counted twice."
    ) in html
    assert (
        "<tr><td>requests</td><td><code>requests.rotated.jsonl:12</code></td><td>conflicting "
        "duplicate: same request_id as requests.jsonl:1, which is loaded, but a different "
        "prompt_tokens</td></tr>"
    ) in html
    md = (out / "report.md").read_text()
    assert "| requests | `request_id` | exact duplicate | 11 | " in md
    assert "No row repeats an event already loaded." in (reference / "report.md").read_text()


# --- repeats judged across every file at once (evidence read in place) ----------------------

LEG = {
    "request_id": "e1",
    "role": "decode",
    "node": "decode-1",
    "started_at": "2026-09-08T14:00:00Z",
    "reserved_tokens": 64,
}


def _three_files(tmp_path: Path, kind: str) -> list[Path]:
    base = ROW if kind == "requests" else LEG
    other = "request_id"
    return [
        jsonl(
            tmp_path / "a.jsonl",
            [base, dict(base, **{other: "x2"}), base, dict(base, **{other: "x3"})],
        ),
        jsonl(
            tmp_path / "b.jsonl",
            [
                dict(base, **{other: "x2"}),
                dict(base, **{other: "x4"}),
                # A conflicting copy of a row of a.jsonl, then an exact one of it.
                dict(base, **({"tenant_id": "acct_z"} if kind == "requests" else {"error": "e"})),
                base,
            ],
        ),
        jsonl(tmp_path / "c.jsonl", [dict(base, **{other: "x4"}), dict(base, **{other: "x5"})]),
    ]


def test_repeats_across_every_file_at_once_are_the_ones_loading_in_order_finds(tmp_path):
    # Read in place, each file is loaded on its own without judging repeats, and one query
    # over all of them flags what loading them one after the other rejects, with the same
    # reasons; loading each file again with those flags gives the same tables.
    from forensics.repeats import repeats_sql

    for kind in ("requests", "engine_legs"):
        folder = tmp_path / kind
        folder.mkdir()
        files = _three_files(folder, kind)
        in_order = connect(":memory:")
        for path in files:
            ingest_file(in_order, path, kind)
        expected = in_order.execute(
            "SELECT evidence_id, source_row, column_name, reason FROM rejects ORDER BY 1, 2"
        ).fetchall()
        assert len(expected) == 5, expected  # two in a.jsonl, two in b.jsonl, one in c.jsonl

        alone = connect(":memory:")
        for path in files:
            result = ingest_file(alone, path, kind, check_duplicates=False)
            assert result.rows_rejected == 0
        alone.execute("CREATE TEMP TABLE files AS SELECT evidence_id, path FROM evidence")
        sql = repeats_sql(kind, kind, "files")
        assert sql is not None
        flags = alone.execute(f"SELECT * FROM ({sql}) ORDER BY 1, 2").fetchall()
        assert flags == expected

        again = connect(":memory:")
        for eid, path in enumerate(files, start=1):
            mine = [(row, col, reason) for e, row, col, reason in flags if e == eid]
            ingest_file(again, path, kind, check_duplicates=False, flags=mine)
        for table in (kind, "rejects", "evidence"):
            columns = "* EXCLUDE (loaded_at)" if table == "evidence" else "*"
            got, want = (
                c.execute(f"SELECT {columns} FROM {table} ORDER BY ALL").fetchall()
                for c in (again, in_order)
            )
            assert got == want, table


def test_a_kind_without_identity_has_no_repeats():
    from forensics.repeats import repeats_sql

    assert repeats_sql("tenants", "t", "f") is None
