"""Compare a case's findings with a simulator's ground truth (``truth/`` of a simulated case).

This is how we know the detectors work: recall and precision of affected responses, exact
agreement of exclusions, and precision/recall of source attribution, on cases where the answer
is known because the simulator produced it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forensics.verdicts import NOTIFIED_VERDICTS

if TYPE_CHECKING:
    import duckdb


@dataclass
class Score:
    true_positive: int
    false_positive: int
    false_negative: int

    @property
    def precision(self) -> float:
        found = self.true_positive + self.false_positive
        return self.true_positive / found if found else 1.0

    @property
    def recall(self) -> float:
        real = self.true_positive + self.false_negative
        return self.true_positive / real if real else 1.0

    def __str__(self) -> str:
        return (
            f"precision {self.precision:.3f} recall {self.recall:.3f} "
            f"(tp {self.true_positive}, fp {self.false_positive}, fn {self.false_negative})"
        )


def score(found: set, truth: set) -> Score:
    """Set comparison.

    >>> str(score({1, 2, 3}, {2, 3, 4}))
    'precision 0.667 recall 0.667 (tp 2, fp 1, fn 1)'
    """
    return Score(len(found & truth), len(found - truth), len(truth - found))


@dataclass
class Evaluation:
    affected: Score  # confirmed + likely against truth/affected.csv
    possible_unaffected: int  # "possible" verdicts on unaffected requests (review load)
    exclusions_exact: bool
    exclusion_mismatches: list[tuple]
    source_pairs: Score  # (recipient request, source tenant) pairs
    source_tenants: Score  # the set of tenants whose data leaked
    methods: dict[str, int]
    # Scoping, when findings_notifications exists: tenants told their data was read, against
    # the customers whose data truly went to another tenant; and notified plus review
    # candidates together (what a responder sees at all).
    notified_sources: Score | None = None
    candidate_sources: Score | None = None

    def lines(self) -> list[str]:
        return [
            f"affected responses: {self.affected}",
            f"'possible' verdicts on unaffected requests: {self.possible_unaffected}",
            f"exclusions exact: {self.exclusions_exact}",
            f"source tenants per response: {self.source_pairs}",
            f"source tenants overall: {self.source_tenants}",
            f"attribution methods: {self.methods}",
            f"notified source tenants: {self.notified_sources}",
            f"notified + review source tenants: {self.candidate_sources}",
        ]


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def evaluate(con: duckdb.DuckDBPyConnection, truth_dir: Path) -> Evaluation:
    """Score the findings in ``con`` against ``truth_dir`` (affected.csv, exposures.csv)."""
    truth_affected = {r["request_id"]: r for r in _read(truth_dir / "affected.csv")}
    truth_exposures = _read(truth_dir / "exposures.csv")
    verdicts = dict(con.execute("SELECT request_id, verdict FROM findings_affected").fetchall())
    notified = {rid for rid, v in verdicts.items() if v in NOTIFIED_VERDICTS}
    possible_unaffected = sum(
        1 for rid, v in verdicts.items() if v == "possible" and rid not in truth_affected
    )
    found_excl = dict(
        con.execute(
            "SELECT request_id, coalesce(excluded_by, '') FROM findings_affected"
            " WHERE notified_verdict(verdict)"
        ).fetchall()
    )
    mismatches = [
        (rid, row["excluded_by"], found_excl.get(rid))
        for rid, row in sorted(truth_affected.items())
        if rid in found_excl and (row["excluded_by"] or "") != found_excl[rid]
    ]
    found_pairs = set(
        con.execute(
            "SELECT DISTINCT recipient_request_id, source_tenant_id FROM findings_exposures"
        ).fetchall()
    )
    true_pairs = {(r["recipient_request_id"], r["source_tenant_id"]) for r in truth_exposures}
    methods = dict(
        con.execute("SELECT method, count(*) FROM findings_exposures GROUP BY method").fetchall()
    )
    told_score = listed_score = None
    tables = {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    if {"findings_notifications", "findings_review"} <= tables:
        # Customers whose data truly reached another tenant: cross-tenant pairs whose source
        # tenant is not excluded traffic (exclusions themselves are checked exactly above).
        excluded = {
            r[0] for r in con.execute("SELECT DISTINCT tenant_id FROM findings_excluded").fetchall()
        }
        recipient_tenant = {rid: r["tenant_id"] for rid, r in truth_affected.items()}
        truth_sources = {
            r["source_tenant_id"]
            for r in truth_exposures
            if r["source_tenant_id"] != recipient_tenant.get(r["recipient_request_id"])
            and r["source_tenant_id"] not in excluded
        }
        told = {
            r[0]
            for r in con.execute(
                "SELECT tenant_id FROM findings_notifications WHERE role = 'source'"
            ).fetchall()
        }
        listed = {
            r[0]
            for r in con.execute(
                "SELECT tenant_id FROM findings_review WHERE role = 'source'"
                " AND tenant_id IS NOT NULL"
            ).fetchall()
        }
        told_score = score(told, truth_sources)
        listed_score = score(told | listed, truth_sources)
    return Evaluation(
        affected=score(notified, set(truth_affected)),
        possible_unaffected=possible_unaffected,
        exclusions_exact=not mismatches,
        exclusion_mismatches=mismatches,
        source_pairs=score(found_pairs, true_pairs),
        source_tenants=score({p[1] for p in found_pairs}, {p[1] for p in true_pairs}),
        methods=methods,
        notified_sources=told_score,
        candidate_sources=listed_score,
    )


@dataclass
class TenantRating:
    """One tenant's exploitation rating beside the simulator's truth about it."""

    tenant_id: str
    profile: str  # chat, code, rag, longctx, agentic, docqa, prober, researcher, internal
    strategy: str  # the prober strategy, or "" for a tenant that does not probe
    deliberate: bool
    level: str  # none, low, medium, high (none when not assessed)
    reasons: list[str]

    @property
    def customer(self) -> bool:
        return self.profile not in ("researcher", "internal")

    @property
    def wrong(self) -> bool:
        """A prober not rated high, or a benign customer rated above low."""
        if self.deliberate:
            return self.level != "high"
        return self.customer and self.level not in ("none", "low")


def evaluate_exploitation(
    con: duckdb.DuckDBPyConnection, truth_dir: Path
) -> tuple[list[TenantRating], dict]:
    """Every tenant of ``truth_dir/tenants.csv`` with its rating, and the case conclusion."""
    import json

    rated = {
        r[0]: (r[1], json.loads(r[2]))
        for r in con.execute(
            "SELECT tenant_id, level, reasons FROM findings_exploitation"
        ).fetchall()
    }
    rows = []
    for t in _read(truth_dir / "tenants.csv"):
        level, reasons = rated.get(t["tenant_id"], ("none", []))
        rows.append(
            TenantRating(
                t["tenant_id"],
                t["profile"],
                t["strategy"],
                t["deliberate"] == "true",
                level,
                reasons,
            )
        )
    value = con.execute("SELECT value FROM findings_case WHERE key = 'exploitation'").fetchone()
    return rows, json.loads(value[0]) if value else {}
