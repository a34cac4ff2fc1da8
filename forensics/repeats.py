"""Repeated events: rows of evidence that record an event already loaded.

An event is known by the columns of ``schema.IDENTITY`` for its kind (a request by its id, an
engine leg by its node, rank, request and start, ...). Of the rows that share an identity the
first loaded, by evidence id and then source row, is kept; every later one is rejected as an
*exact duplicate* when all its canonical columns equal the kept row's, else as a *conflicting
duplicate* that names the columns that differ, and says where the kept row lies.

Three forms of the same rule: :func:`flag_repeats` for one file just inserted,
:func:`may_repeat` to clear a batch of files in one look before that exact check, and
:func:`repeats_sql` for every file of a kind at once (the lake, where Spark runs it translated).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from forensics import schema
from forensics.readers import sql_ident, sql_str
from forensics.sql import scalar
from forensics.status import CONFLICTING_DUPLICATE, EXACT_DUPLICATE

if TYPE_CHECKING:
    import duckdb


def same_sql(a: str, b: str, names: Iterable[str]) -> str:
    """SQL: rows ``a`` and ``b`` agree on every column of ``names`` (NULL equal to NULL)."""
    return " AND ".join(
        f"{a}.{sql_ident(c)} IS NOT DISTINCT FROM {b}.{sql_ident(c)}" for c in names
    )


def repeat_reason_sql(kind: str, c: str = "c", k: str = "k") -> str:
    """SQL of the reason row ``c`` is rejected as a repeat of the kept row ``k`` of the same
    identity (``k.where_kept`` says where that is): an exact duplicate when every canonical
    column is the same, else a conflicting one naming the columns that differ."""
    identity = schema.IDENTITY[kind]
    cols = [col.name for col in schema.columns(kind)]
    differs = ", ".join(
        f"CASE WHEN {c}.{sql_ident(n)} IS DISTINCT FROM {k}.{sql_ident(n)} THEN {sql_str(n)} END"
        for n in cols
    )
    names = " and ".join(identity) if len(identity) < 3 else ", ".join(identity)
    return (
        f"CASE WHEN {same_sql(c, k, cols)} "
        f"THEN '{EXACT_DUPLICATE}: same content as ' || {k}.where_kept || ', which is loaded' "
        f"ELSE '{CONFLICTING_DUPLICATE}: same {names} as ' || {k}.where_kept "
        f"|| ', which is loaded, but a different ' || concat_ws(', ', {differs}) END"
    )


def _ranked_sql(rows: str, keys: str, identity: Sequence[str], where: str = "TRUE") -> str:
    """SQL: the rows of ``rows`` (alias ``t`` in ``where``) whose identity is among ``keys``,
    each ranked within its identity by evidence id, then source row (``__kv_rank``, 1 kept)."""
    key = ", ".join(sql_ident(c) for c in identity)
    return (
        f"SELECT t.*, row_number() OVER (PARTITION BY {key} ORDER BY evidence_id, source_row) "
        f"AS __kv_rank FROM {rows} t SEMI JOIN {keys} d ON {same_sql('t', 'd', identity)} "
        f"WHERE {where}"
    )


def flag_repeats(
    con: duckdb.DuckDBPyConnection,
    kind: str,
    eid: int,
    label: str,
    ignore: list[int],
    tag: str,
) -> str | None:
    """Find the rows of evidence ``eid`` (just inserted) that repeat an event already loaded.

    An event is identified by the columns of ``schema.IDENTITY``; of the rows that share an
    identity, the first loaded (by evidence, then source row) is kept. Every later row of this
    file is flagged: an *exact duplicate* when all its canonical columns equal the kept row's,
    else a *conflicting duplicate* naming the columns that differ. Rows of the ``ignore``
    evidence ids are not compared against.

    Set-based throughout: the identities this file repeats (within itself, or against what is
    loaded: an anti-join, not a lookup per row) are found first, and only those rows are
    ranked and compared. Returns the name of a temp table of ``(source_row, column_name,
    reason)``, or None when nothing repeats.
    """
    identity = schema.IDENTITY.get(kind)
    if not identity:
        return None
    key = ", ".join(sql_ident(c) for c in identity)

    def older(alias: str = "") -> str:
        # Rows loaded before this file, but not those of the partial loads it replaces.
        where = f"{alias}evidence_id <> {eid}"
        if ignore:
            where += f" AND {alias}evidence_id NOT IN ({', '.join(str(i) for i in ignore)})"
        return where

    keys, flagged = f"__kv_dupkeys_{tag}", f"__kv_dups_{tag}"
    repeated = scalar(
        con,
        f"CREATE OR REPLACE TEMP TABLE {keys} AS "
        f"SELECT {key} FROM {kind} WHERE evidence_id = {eid} GROUP BY ALL HAVING count(*) > 1 "
        f"UNION SELECT {', '.join(f'n.{sql_ident(c)}' for c in identity)} FROM {kind} n "
        f"SEMI JOIN (SELECT {key} FROM {kind} WHERE {older()}) o ON {same_sql('n', 'o', identity)} "
        f"WHERE n.evidence_id = {eid}",
    )
    if not repeated:
        con.execute(f"DROP TABLE {keys}")
        return None
    ranked = _ranked_sql(kind, keys, identity, f"t.evidence_id = {eid} OR ({older('t.')})")
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {flagged} AS
        WITH c AS ({ranked}),
        k AS (SELECT * FROM c WHERE __kv_rank = 1)
        SELECT c.source_row, {sql_str(identity[0])} AS column_name,
               {repeat_reason_sql(kind)} AS reason
        FROM c JOIN (
          SELECT k.*, CASE WHEN k.evidence_id = {eid} THEN {sql_str(label)} ELSE e.path END
                      || ':' || k.source_row AS where_kept
          FROM k LEFT JOIN evidence e USING (evidence_id)
        ) k ON {same_sql("c", "k", identity)}
        WHERE c.__kv_rank > 1 AND c.evidence_id = {eid}"""
    )
    con.execute(f"DROP TABLE {keys}")
    return flagged


def repeats_sql(kind: str, rows: str, files: str) -> str | None:
    """The rows of every file of one kind at once that repeat an event of an earlier row: the
    set-based form of what loading the files one after the other finds (:func:`flag_repeats`).

    ``rows`` is a relation of the kind's canonical columns with ``evidence_id`` and
    ``source_row`` (every row of every file, none judged yet); ``files`` one of
    ``(evidence_id, path)``. Of the rows that share an identity the first by evidence id, then
    source row, is kept, as it is when the files load in that order: each later one is flagged
    against it. Returns a query of ``(evidence_id, source_row, column_name, reason)``, or None
    when the kind has no identity. Written in DuckDB's SQL; Spark runs it translated.
    """
    identity = schema.IDENTITY.get(kind)
    if not identity:
        return None
    key = ", ".join(sql_ident(c) for c in identity)
    return f"""WITH keys AS (SELECT {key} FROM {rows} GROUP BY {key} HAVING count(*) > 1),
c AS ({_ranked_sql(rows, "keys", identity)}),
k AS (
  SELECT c.*, f.path || ':' || c.source_row AS where_kept
  FROM c JOIN {files} f ON f.evidence_id = c.evidence_id
  WHERE c.__kv_rank = 1
)
SELECT c.evidence_id, c.source_row, {sql_str(identity[0])} AS column_name,
       {repeat_reason_sql(kind)} AS reason
FROM c JOIN k ON {same_sql("c", "k", identity)}
WHERE c.__kv_rank > 1"""


def may_repeat(con: duckdb.DuckDBPyConnection, kind: str, eids: Sequence[int]) -> bool:
    """Whether a row of the evidence ``eids`` (just inserted) may share its event's identity
    with another row of ``kind``: of these files or of any loaded before.

    False means :func:`flag_repeats` would find nothing in any of them, so the batch skips it;
    a true repeat always says True. Within the batch the identities are grouped by their hash
    (a collision says True, and the exact check runs); against what was loaded before, one semi
    join on the identity's columns themselves, whose bounds DuckDB pushes into the scan of the
    older rows (an engine leg's start time skips the row groups of other days). One scan of the
    older rows for the whole batch, where the exact check takes one for each file: with hourly
    files over weeks, the difference between rows times batches and rows times files.
    """
    identity = schema.IDENTITY.get(kind)
    if not identity:
        return False
    cols = ", ".join(sql_ident(c) for c in identity)
    ids = ", ".join(str(e) for e in eids)
    batch = f"(SELECT {cols} FROM {kind} WHERE evidence_id IN ({ids}))"
    within = scalar(
        con, f"SELECT EXISTS (SELECT 1 FROM {batch} GROUP BY hash({cols}) HAVING count(*) > 1)"
    )
    return bool(within) or bool(
        scalar(
            con,
            f"SELECT EXISTS (SELECT 1 FROM {kind} o SEMI JOIN {batch} n "
            f"ON {same_sql('o', 'n', identity)} WHERE o.evidence_id NOT IN ({ids}))",
        )
    )


def given_flags(
    con: duckdb.DuckDBPyConnection, flags: Sequence[tuple[int, str | None, str]], tag: str
) -> str | None:
    """The rows a caller flagged, as the table :func:`flag_repeats` makes (None: no row)."""
    if not flags:
        return None
    flagged = f"__kv_dups_{tag}"
    rows, columns, reasons = (list(v) for v in zip(*flags, strict=True))
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {flagged} AS SELECT unnest(?::BIGINT[]) AS source_row, "
        "unnest(?::VARCHAR[]) AS column_name, unnest(?::VARCHAR[]) AS reason",
        [rows, columns, reasons],
    )
    return flagged
