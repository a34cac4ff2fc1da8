"""Derive ``mooncake_sessions.csv.gz`` from the Mooncake FAST'25 conversation trace (run once).

Usage::

    python forensics/simulate/data/derive_sessions.py conversation_trace.jsonl \
        forensics/simulate/data/mooncake_sessions.csv.gz

The trace (GitHub ``kvcache-ai/Mooncake``, ``FAST25-release/traces/conversation_trace.jsonl``)
lists 12,031 requests with an arrival offset, prompt and output lengths and the hashes of the
prompt's 512-token blocks. Block 0 is a system prompt shared by every request, so conversations
are told apart by the blocks after it:

1. A request's parent is the latest earlier request whose full blocks (at least two, so more
   than the system prompt) are a prefix of this request's blocks, the longest such prefix
   winning: the previous turn of the same conversation.
2. A request that does not contain most of its parent's answer (it grew by less than half the
   parent's output) re-asks the parent's turn instead of continuing it: a regeneration or an
   edited message. It becomes a sibling of its parent (a child of the grandparent), or another
   opening of the conversation when the parent opened it.
3. ``added_tokens`` is what the turn adds after its parent's prompt and answer: the user's
   message, attachments included (``input - parent input - parent output``). Where the trace's
   next prompt keeps a little less than the whole answer (a client trimming it), this would be
   negative and is taken as one token, so a replay can grow every turn by exactly the answer
   plus the message. An opening's ``added_tokens`` is its whole prompt.

Output: one row per request, columns ``session, turn, parent, offset_ms, input_length,
output_length, added_tokens``; sessions numbered by first arrival, turns by arrival, ``parent``
the turn index the row continues (-1 for an opening), ``offset_ms`` from the session's first
request. Written as gzip with no name and mtime 0, so the same input gives the same bytes.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
from pathlib import Path

BLOCK = 512


def derive(rows: list[dict]) -> list[tuple[int, int, int, int, int, int, int]]:
    """Session rows (see the module docstring) from trace rows in file order.

    >>> trace = [
    ...     {"timestamp": 0, "input_length": 1500, "output_length": 100, "hash_ids": [0, 1, 2]},
    ...     {"timestamp": 0, "input_length": 900, "output_length": 50, "hash_ids": [0, 7]},
    ...     {"timestamp": 30, "input_length": 1630, "output_length": 80, "hash_ids": [0, 1, 3, 4]},
    ...     {"timestamp": 60, "input_length": 1500, "output_length": 90, "hash_ids": [0, 1, 5]},
    ... ]
    >>> for row in derive(trace):
    ...     print(row)
    (0, 0, -1, 0, 1500, 100, 1500)
    (0, 1, 0, 30, 1630, 80, 30)
    (0, 2, -1, 60, 1500, 90, 1500)
    (1, 0, -1, 0, 900, 50, 900)
    """
    by_prefix: dict[tuple[int, ...], int] = {}
    parent = [-1] * len(rows)
    for i, r in enumerate(rows):
        h = r["hash_ids"]
        for k in range(len(h), 1, -1):
            p = by_prefix.get(tuple(h[:k]))
            if p is not None:
                parent[i] = p
                break
        full = r["input_length"] // BLOCK
        if full >= 2:
            by_prefix[tuple(h[:full])] = i
    # Root of each request's conversation (the tree before re-asks are re-attached).
    root = list(range(len(rows)))
    for i, p in enumerate(parent):
        if p >= 0:
            root[i] = root[p]
            if _reasks(rows[i], rows[p]):
                parent[i] = parent[p]  # a sibling of the re-asked turn (or another opening)
    sessions: dict[int, list[int]] = {}
    for i in range(len(rows)):
        sessions.setdefault(root[i], []).append(i)
    out = []
    for s, (_, members) in enumerate(sorted(sessions.items(), key=lambda kv: (kv[1][0], kv[0]))):
        turn_of = {i: t for t, i in enumerate(members)}
        t0 = rows[members[0]]["timestamp"]
        for t, i in enumerate(members):
            r, p = rows[i], parent[i]
            if p < 0:
                added, pt = r["input_length"], -1
            else:
                q = rows[p]
                added = max(1, r["input_length"] - q["input_length"] - q["output_length"])
                pt = turn_of[p]
            out.append(
                (s, t, pt, r["timestamp"] - t0, r["input_length"], r["output_length"], added)
            )
    return out


def _reasks(child: dict, parent: dict) -> bool:
    """Whether ``child`` grew by less than half its parent's answer (it re-asks the turn)."""
    return child["input_length"] - parent["input_length"] < parent["output_length"] / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="conversation_trace.jsonl")
    ap.add_argument("out", type=Path, help="the .csv.gz to write")
    args = ap.parse_args()
    with args.trace.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    table = derive(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["session", "turn", "parent", "offset_ms", "input_length", "output_length", "added_tokens"]
    )
    w.writerows(table)
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(buf.getvalue().encode("ascii"))
    args.out.write_bytes(raw.getvalue())
    n_sessions = table[-1][0] + 1 if table else 0
    print(f"{len(table)} requests, {n_sessions} sessions -> {args.out} ({len(raw.getvalue())} B)")


if __name__ == "__main__":
    main()
