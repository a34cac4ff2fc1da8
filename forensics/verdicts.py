"""The vocabulary of conclusions: verdicts, attribution confidences and what gets notified.

One home for these rules so detection, scoping, notices and evaluation cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable

# A verdict per flagged request, strongest first. Only the first two are notified; ``possible``
# is listed for review.
VERDICTS = ("confirmed", "likely", "possible")
NOTIFIED_VERDICTS = ("confirmed", "likely")

# Attribution confidences, best first: the one order for notifications, notices and reports.
# exact: allocation log; high: allocator replay over engine legs; medium: the same replay over
# client times (or an engine-leg replay that had drifted, or a writer it read in one order of
# a queue run only); low: the same for a client-time replay, or a release on the same node
# within the overlap window; very_low: an earlier release there.
CONFIDENCE_ORDER = ("exact", "high", "medium", "low", "very_low")
# A source tenant is notified only on page-level evidence at one of these confidences; a
# tenant named only at a lower one is a candidate and goes to the review list.
NOTIFIED_CONFIDENCES = ("exact", "high", "medium")


def best_confidence(confidences: Iterable[str]) -> str:
    """The most certain of several attribution confidences.

    >>> best_confidence(["very_low", "medium", "low"])
    'medium'
    """
    return min(
        confidences,
        key=lambda c: CONFIDENCE_ORDER.index(c) if c in CONFIDENCE_ORDER else len(CONFIDENCE_ORDER),
    )


def sql_list(values: Iterable[str]) -> str:
    """A fixed vocabulary as an SQL list literal (for constants only, never for data).

    >>> sql_list(NOTIFIED_VERDICTS)
    "('confirmed', 'likely')"
    """
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


def vocabulary_macros() -> list[str]:
    """DuckDB macros that put these rules into SQL, created on every case connection.

    >>> import duckdb
    >>> con = duckdb.connect()
    >>> for m in vocabulary_macros():
    ...     _ = con.execute(m)
    >>> con.execute("SELECT notified_verdict('likely'), notified_confidence('low')").fetchone()
    (True, False)
    """
    return [
        f"CREATE OR REPLACE TEMP MACRO notified_verdict(v) AS v IN {sql_list(NOTIFIED_VERDICTS)}",
        "CREATE OR REPLACE TEMP MACRO notified_confidence(c) AS "
        f"c IN {sql_list(NOTIFIED_CONFIDENCES)}",
        # Position in CONFIDENCE_ORDER (1 = most certain); unknown values sort last.
        "CREATE OR REPLACE TEMP MACRO confidence_rank(c) AS "
        f"coalesce(list_position({_sql_array(CONFIDENCE_ORDER)}, c), "
        f"{len(CONFIDENCE_ORDER) + 1})",
        f"CREATE OR REPLACE TEMP MACRO confidence_at(i) AS {_sql_array(CONFIDENCE_ORDER)}[i]",
        # The same for verdicts (1 = confirmed).
        "CREATE OR REPLACE TEMP MACRO verdict_rank(v) AS "
        f"coalesce(list_position({_sql_array(VERDICTS)}, v), {len(VERDICTS) + 1})",
        f"CREATE OR REPLACE TEMP MACRO verdict_at(i) AS {_sql_array(VERDICTS)}[i]",
    ]


def _sql_array(values: Iterable[str]) -> str:
    return "[" + ", ".join("'" + v + "'" for v in values) + "]"
