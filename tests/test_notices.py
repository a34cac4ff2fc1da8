"""What a notice tells a customer, on small hand-built findings whose answer is known.

Scenario (all on 2026-09-01, UTC): acct_src's s1 was read by its own later response v_own, by
another customer's v_cust and by the researcher's v_res; its s3 only by v_own. acct_lone's s2
was read only by the researcher's v_res. acct_other received v_cust.
"""

from __future__ import annotations

import csv

from fixtures.findings.builder import CASE_TOML, build, ts

from forensics.report import write_report

REQUESTS = [
    ("s1", "acct_src", ts(9, 0), 50_000, 4_000.0, "decode-1"),
    ("s3", "acct_src", ts(9, 10), 60_000, 4_500.0, "decode-1"),
    ("s2", "acct_lone", ts(9, 30), 70_000, 5_000.0, "decode-1"),
    ("v_own", "acct_src", ts(10, 0), 700_000, 40.0, "decode-1"),
    ("v_cust", "acct_other", ts(10, 5), 700_000, 41.0, "decode-1"),
    ("v_res", "acct_researcher", ts(10, 10), 700_000, 42.0, "decode-1"),
]
AFFECTED = [
    ("v_own", "confirmed", "over_pool,prefill_rejected", None),
    ("v_cust", "confirmed", "over_pool,prefill_rejected", None),
    ("v_res", "confirmed", "over_pool,prefill_rejected", "researcher"),
]
EXPOSURES = [
    ("v_own", "s1", "allocator_replay", 20_000, "high", None),
    ("v_own", "s3", "allocator_replay", 20_000, "high", None),
    ("v_cust", "s1", "allocator_replay", 20_000, "high", None),
    ("v_res", "s1", "allocation_log", 20_000, "exact", None),
    ("v_res", "s2", "allocation_log", 20_000, "exact", None),
]


def _notices(tmp_path, case_toml=CASE_TOML, **kw):
    case, con = build(
        tmp_path / "case",
        requests=kw.get("requests", REQUESTS),
        affected=kw.get("affected", AFFECTED),
        exposures=kw.get("exposures", EXPOSURES),
        case_toml=case_toml,
    )
    out = tmp_path / "out"
    write_report(con, case, out)
    con.close()
    return out / "notices"


def test_own_reads_are_told_apart_from_other_customers_and_our_traffic(tmp_path):
    notices = _notices(tmp_path)
    src = (notices / "acct_src.md").read_text()
    assert "- 1 response to other customers' requests read it" in src
    assert "- 1 response that read it went to traffic that is not a customer's:" in src
    assert "Bug bounty reproduction traffic." in src
    assert "- 1 response to your own later requests also read it" in src
    # s3 was read only by acct_src's own response: not an exposure, not listed as one.
    assert "| `s1` |" in src and "`s3`" not in src
    # As a recipient, v_own read only acct_src's own data: said so, no deletion warning.
    assert "| `v_own` |" in src and "your own earlier requests only |" in src
    assert "may contain another customer's confidential data" not in src
    other = (notices / "acct_other.md").read_text()
    assert "- 1 response read another customer's data" in other
    assert "may contain another customer's confidential data" in other


def test_a_source_read_only_by_excluded_traffic_is_told_so_plainly(tmp_path):
    lone = (_notices(tmp_path) / "acct_lone.md").read_text()
    assert "- No other customer received it." in lone
    assert "These were the only responses that read your data." in lone
    assert "acct_researcher" not in lone and "v_res" not in lone


def test_long_request_lists_go_to_the_csv_beside_the_letter(tmp_path):
    many = [(f"v{i:02d}", "acct_many", ts(11, i), 700_000, 40.0, "decode-1") for i in range(12)]
    notices = _notices(
        tmp_path,
        requests=REQUESTS + many,
        affected=AFFECTED + [(r[0], "likely", "over_pool", None) for r in many],
    )
    letter = (notices / "acct_many.md").read_text()
    assert "12 of your responses, between 1 September 2026, 11:00 UTC and" in letter
    assert "11:11 UTC, were generated while the model" in letter
    assert "is listed in the file `acct_many.csv` sent with this notice" in letter
    assert "| `v00` |" not in letter
    with (notices / "acct_many.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["request_id"] for r in rows] == [r[0] for r in many]
    assert {r["role"] for r in rows} == {"recipient"}
    assert {r["data_read"] for r in rows} == {"not determined"}


def test_fix_status_comes_from_a_marked_event_else_the_pool_snapshots(tmp_path):
    # No context length: the pools cannot be judged, and nothing is marked: no fix claimed.
    letter = (_notices(tmp_path / "a") / "acct_other.md").read_text()
    assert "Our logs do not yet show that the cause was fixed" in letter
    assert "The last response affected by this defect in our logs was on" in letter
    assert "1 September 2026, 10:10 UTC" in letter

    # With the context length, prefill-1's limit stops being pool-bound at 15:00.
    with_ctx = CASE_TOML.replace(
        'end = "2026-09-02T00:00:00Z"', 'end = "2026-09-02T00:00:00Z"\ncontext_length = 1048576'
    )
    letter = (_notices(tmp_path / "b", case_toml=with_ctx) / "acct_other.md").read_text()
    assert "The cause was fixed on 1 September 2026, 15:00 UTC (pool snapshots:" in letter

    marked = CASE_TOML + (
        '\n[[timeline]]\nat = "2026-09-01T16:30:00Z"\nevent = "Engine patch deployed"\nfix = true\n'
    )
    letter = (_notices(tmp_path / "c", case_toml=marked) / "acct_other.md").read_text()
    assert "The cause was fixed on 1 September 2026, 16:30 UTC (Engine patch deployed)." in letter
    # The report's summary says the same, from the same statement.
    summary = (tmp_path / "c" / "out" / "report.md").read_text()
    assert "| Cause fixed | 1 September 2026, 16:30 UTC | Basis: Engine patch deployed." in summary
    summary = (tmp_path / "a" / "out" / "report.md").read_text()
    assert "| Cause fixed | not shown by the logs |" in summary


def test_all_letters_come_from_one_query_per_part_and_match_one_letter_at_a_time(
    tmp_path, monkeypatch
):
    """Every tenant's context, built from the queries over all tenants (streamed a row at a
    time here, so every batch boundary is crossed), equals the one built for that tenant
    alone; and the number of queries does not grow with the number of tenants."""
    from forensics.report import notices
    from forensics.scope import load_scope

    case, con = build(tmp_path / "case")
    scope = load_scope(con)
    alone = {t: notices.notice_context(con, scope, t) for t in scope.tenants}
    monkeypatch.setattr(notices, "BATCH_ROWS", 1)
    together = dict(notices.notice_contexts(con, scope))
    assert list(together) == sorted(scope.tenants)
    assert together == alone
    for tenant, ctx in together.items():
        assert ctx["tenant"]["id"] == tenant
        rows = (ctx["recipient"] or {}).get("requests", []) + (ctx["source"] or {}).get(
            "requests", []
        )
        assert all("tenant_id" not in r for r in rows)

    queries: list[str] = []

    class Counting:
        def __init__(self, real):
            self.real = real

        def execute(self, *args, **kwargs):
            queries.append(args[0])
            return self.real.execute(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.real, name)

    from forensics import db

    real_cursor = db.cursor
    monkeypatch.setattr(db, "cursor", lambda c: Counting(real_cursor(c.real)))
    list(notices.notice_contexts(Counting(con), scope))
    several = len(queries)
    queries.clear()
    list(notices.notice_contexts(Counting(con), scope, scope.tenants[:1]))
    assert len(queries) == several  # one query per part, for one tenant or for all
    con.close()


def test_the_letters_queries_hold_a_million_source_requests_in_256_mb(tmp_path):
    """Each part of the letters streams whatever its size: at 100M requests (4.8M source
    requests read) the sources' query ran out of memory under the 2 GB limit, in count(DISTINCT)
    and then in a sort carrying each row's CSV line. Here 1M source requests, each read by two
    responses, under a 256 MB limit (the old query stopped there too)."""
    from forensics.db import connect, cursor
    from forensics.report.notices import _RECIPIENT_SQL, _SOURCE_SQL
    from forensics.schema import FINDINGS_DDL
    from forensics.sql import OrderedGroups

    sources = 1_000_000
    con = connect(tmp_path / "case.duckdb", memory_limit="256MB")
    for table in ("findings_affected", "findings_exposures", "findings_source_requests"):
        con.execute(FINDINGS_DDL[table].replace("TEMP TABLE", "TABLE"))
    con.execute(
        """INSERT INTO findings_affected (request_id, tenant_id, received_at, verdict)
           SELECT 'victim-' || i, 'acct_v' || (i % 50),
                  TIMESTAMPTZ '2026-09-01' + INTERVAL (i) SECOND, 'confirmed'
           FROM range(1000) t(i)"""
    )
    # Exposure 2k and 2k+1 are two responses (of two tenants) reading source request k.
    con.execute(
        """INSERT INTO findings_exposures (recipient_request_id, recipient_tenant_id,
             source_request_id, source_tenant_id, method, tokens, confidence)
           SELECT 'victim-' || (i % 1000), 'acct_v' || (i % 1000 % 50), 'source-' || (i // 2),
                  'acct_s' || (i // 2 % 100), 'allocator_replay', 64, 'high'
           FROM range($n) t(i)""",
        {"n": 2 * sources},
    )
    con.execute(
        """INSERT INTO findings_source_requests
           SELECT 'source-' || i, 'acct_s' || (i % 100),
                  TIMESTAMPTZ '2026-08-30' + INTERVAL (i) SECOND
           FROM range($n) t(i)""",
        {"n": sources},
    )
    tenants = sorted(f"acct_s{i}" for i in range(100))
    groups = OrderedGroups(cursor(con).execute(_SOURCE_SQL, {"tenants": tenants}))
    rows = 0
    for tenant in tenants:
        mine = groups.take((tenant,))
        assert len(mine) == sources // 100
        assert all(r["read_by_customers"] == 2 and r["read_by_ours"] == 0 for r in mine)
        assert all(r["csv_line"].startswith("source,source-") for r in mine)
        # In the order the letter lists them: by arrival.
        assert [r["received_at"] for r in mine] == sorted(r["received_at"] for r in mine)
        rows += len(mine)
    assert rows == sources
    recipients = [f"acct_v{i}" for i in range(50)]
    groups = OrderedGroups(cursor(con).execute(_RECIPIENT_SQL, {"tenants": sorted(recipients)}))
    assert sum(len(groups.take((t,))) for t in sorted(recipients)) == 1000
    con.close()
