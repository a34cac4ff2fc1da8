"""A faithful simulator of the incident: a PD-disaggregated fleet, its traffic and its bug.

``simulate_case`` writes a complete case folder: ``case.toml``, canonical evidence under
``evidence/`` and the ground truth under ``truth/``. The truth comes from the simulation itself
(which requests took the bug path, and which earlier requests last wrote each stale page the
allocator handed them), never from re-reading the evidence, and this package imports nothing
from detection, attribution or scoping.

Layout: ``config`` (fleet and knobs), ``traffic`` (tenants, arrivals, lengths), ``sessions``
(long-context customers: conversations, coding agents, document questions), ``probers``
(customers probing the limit on purpose), ``fleet`` (routing, code paths, leg durations),
``allocator`` (decode page pools and page writers), ``writer`` (files). ``data/`` holds the
conversation structure replayed by ``sessions`` (derived from a public trace; see its README).

The truth also says who each tenant is (``truth/tenants.csv``: profile, and whether it
triggered the bug on purpose, with which strategy), which session and turn every long-context
request belongs to (``truth/sessions.csv``) and which prober requests probed or exploited
(``truth/probes.csv``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from forensics.errors import ForensicsError
from forensics.simulate.config import (
    ENGINE_VERSION_AFTER,
    ENGINE_VERSION_BEFORE,
    PROBER_STRATEGIES,
    SMALL_PREFILL_POOL,
    US,
    SimConfig,
    make_config,
    max_req_input_len,
)

FORMATS = ("canonical", "sglang", "otel", "litellm")

__all__ = ["FORMATS", "SimConfig", "SimulationSummary", "simulate_case"]


@dataclass
class SimulationSummary:
    """What a simulation wrote and the headline counts of its ground truth."""

    out_dir: Path
    case_path: Path
    seed: int
    requests: int
    affected: int
    affected_excluded: int
    exposures: int
    # Both as the report counts them: customers with an affected response (excluded traffic
    # left out), and customers whose request another tenant's affected response read.
    recipient_tenants: int
    source_tenants: int
    files: dict[str, int] = field(default_factory=dict)  # file format -> files written
    profiles: dict[str, int] = field(default_factory=dict)  # profile -> tenants
    probers: dict[str, int] = field(default_factory=dict)  # strategy -> requests sent


def simulate_case(
    out_dir: str | Path,
    requests: int = 30_000,
    seed: int = 0,
    fmt: str = "canonical",
    kv_allocations: bool = False,
    **config,
) -> SimulationSummary:
    """Simulate the fleet and write a complete case folder.

    Args:
        out_dir: the case folder (created; files of an earlier simulation there are replaced).
        requests: total client requests, researcher and internal canaries included.
        seed: everything is a function of it: the same seed gives the same bytes.
        fmt: evidence format: ``canonical``, or a real serving stack's (``sglang``: engine
            logs only; ``otel``, ``litellm``: engine logs and that client log; see
            :mod:`forensics.simulate.formats`).
        kv_allocations: also write the allocator log (``evidence/kv_allocations.parquet``).
        **config: any ``SimConfig`` field, e.g. ``days=3`` or ``page_size=32``.

    Returns:
        Counts and the files written.

    Raises:
        ForensicsError: an unknown format or setting, or too few requests.
    """
    import numpy as np

    from forensics.simulate import allocator, fleet, probers, sessions, traffic, writer

    if fmt not in FORMATS:
        raise ForensicsError(f"simulate: unknown format {fmt!r} (supported: {', '.join(FORMATS)})")
    if requests < 200:
        raise ForensicsError("simulate: --requests must be at least 200")
    cfg = make_config(**config)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ForensicsError(f"{out}: exists and is not a folder")

    seq = np.random.SeedSequence(seed)
    r_ten, r_int, r_res, r_cust, r_ids, r_plan, r_sess, r_probe = (
        np.random.default_rng(s) for s in seq.spawn(8)
    )

    # --- traffic -------------------------------------------------------------------------
    tenants, weights = traffic.make_tenants(cfg, r_ten)
    internal = traffic.internal_traffic(cfg, tenants, max(20, requests * 3 // 100), r_int)
    threshold = max_req_input_len(SMALL_PREFILL_POOL, cfg.context_length)
    research = traffic.researcher_traffic(cfg, tenants, threshold, requests // 100, r_res)
    n_cust = requests - len(internal.received_us) - len(research.received_us)
    # Clients that wait for each answer first (probers, then long-context sessions, each with
    # its own random stream so adding probers leaves the sessions as they were); the
    # short-prompt customers fill the rest of the request count.
    probe_sender = traffic.Sender(cfg, tenants, r_probe)
    prober_stats = probers.prober_traffic(cfg, tenants, n_cust // 4, probe_sender)
    session_sender = traffic.Sender(cfg, tenants, r_sess)
    budgets = traffic.long_budgets(cfg, tenants, weights, n_cust)
    session_stats = sessions.session_traffic(cfg, tenants, budgets, session_sender)
    reactive = traffic.concat([session_sender.traffic(), probe_sender.traffic()])
    short_w = traffic.short_weights(tenants, weights)
    n_short = n_cust - len(reactive.received_us)
    if n_short > 0 and short_w.sum() <= 0:
        raise ForensicsError("simulate: no short-prompt customer tenant is left")
    customers = traffic.customer_traffic(cfg, tenants, short_w, n_short, r_cust)
    tr = traffic.concat([customers, reactive, research, internal])
    n = len(tr.received_us)

    # Request ids: 32 hex digits from two random 64-bit halves, so lexicographic order of the
    # id strings is the numeric order of (hi, lo): ties sort by request_id without strings.
    hi = r_ids.integers(0, 2**64, size=n, dtype=np.uint64)
    lo = r_ids.integers(0, 2**64, size=n, dtype=np.uint64)
    rid_rank = np.empty(n, dtype=np.int64)
    rid_rank[np.lexsort((lo, hi))] = np.arange(n)
    # Hex of the big-endian halves, cut into 32-character ids without a Python loop.
    halves = np.stack([hi, lo], axis=1).astype(">u8")
    raw_ids = np.frombuffer(halves.tobytes().hex().encode("ascii"), dtype="S32")
    if len(np.unique(raw_ids)) != n:
        raise ForensicsError("simulate: request id collision; choose another seed")

    # --- fleet: routing, code paths, durations ------------------------------------------
    pl_ = fleet.plan(cfg, tr, r_plan)
    prefill_start = tr.received_us + pl_.dispatch
    decode_want = prefill_start + pl_.handshake
    allocates = (pl_.outcome == fleet.OK) | (pl_.outcome == fleet.VICTIM)
    victim = pl_.outcome == fleet.VICTIM
    # Sessions and probers acted on what they were told; it must be what the fleet did.
    seen = tr.expect_outcome >= 0
    if not (
        np.array_equal(pl_.outcome[seen], tr.expect_outcome[seen])
        and np.array_equal(pl_.completion[seen], tr.expect_completion[seen])
    ):
        raise ForensicsError("simulate: a client's view of its answers disagrees with the fleet")

    # --- decode allocators, one per (node, dp rank) --------------------------------------
    alloc_at = np.full(n, -1, dtype=np.int64)
    exposures: list[tuple[int, int, int]] = []
    unwritten = 0
    runs = []
    rank_of_run = []
    total_tokens = tr.prompt + pl_.completion
    for d, (dp_size, pool) in enumerate(zip(cfg.decode_dp_sizes, cfg.decode_pools, strict=True)):
        for r in range(dp_size):
            idx = np.flatnonzero(allocates & (pl_.decode == d) & (pl_.dp_rank == r))
            idx = idx[np.lexsort((rid_rank[idx], decode_want[idx]))]
            res = allocator.run_rank(
                idx,
                decode_want[idx],
                pl_.hold[idx],
                tr.prompt[idx],
                total_tokens[idx],
                victim[idx],
                pool,
                cfg.page_size,
                record_runs=kv_allocations,
            )
            alloc_at[idx] = res.start_us
            exposures += res.exposures
            unwritten += sum(c for _, c in res.stale_unwritten)
            if kv_allocations and res.run_request:
                runs.append(
                    tuple(
                        np.array(x, dtype=np.int64)
                        for x in (res.run_request, res.run_first, res.run_count)
                    )
                )
                rank_of_run.append((d, r))

    # --- instants ------------------------------------------------------------------------
    oc = pl_.outcome
    free_at = np.where(allocates, alloc_at + pl_.hold, -1)
    first_token = np.where(allocates, alloc_at + pl_.to_first_token, -1)
    prefill_end = np.select(
        [allocates, oc == fleet.PREFILL_400, oc == fleet.DECODE_400],
        [alloc_at + pl_.prefill_done, prefill_start + 200, decode_want + 500],
        -1,
    )
    decode_reject_end = decode_want + 300
    completed = (
        np.select(
            [allocates, oc == fleet.TOKENIZER_400, oc == fleet.PREFILL_400],
            [free_at, tr.received_us + pl_.dispatch, prefill_start + 200],
            decode_want + 500,
        )
        + pl_.reply
    )

    names = _Names(cfg, tenants, raw_ids)
    rid = names.rid
    out.mkdir(parents=True, exist_ok=True)
    (out / "evidence").mkdir(exist_ok=True)
    (out / "truth").mkdir(exist_ok=True)
    writer.clear_previous(out)

    files: list[Path] = []
    files += _write_requests(out, writer, names, tr, pl_, rid, first_token, completed)
    files += _write_legs(
        out,
        writer,
        names,
        tr,
        pl_,
        rid,
        prefill_start,
        prefill_end,
        decode_want,
        decode_reject_end,
        alloc_at,
        free_at,
    )
    files.append(_write_snapshots(out, writer, cfg))
    files.append(_write_tenants(out, writer, tenants))
    if kv_allocations:
        files.append(_write_kv(out, writer, names, rid, runs, rank_of_run, alloc_at, free_at))

    # --- truth ---------------------------------------------------------------------------
    # Allocations that queued for pages (their decode start moved later than wanted).
    waited = int(((alloc_at - decode_want) > 1000)[allocates].sum())
    summary = _write_truth(
        out, cfg, tenants, tr, pl_, rid, exposures, unwritten, seed, requests, waited
    )
    summary.update(_write_actors(out, cfg, tenants, tr, pl_, rid, session_stats, prober_stats))
    (out / "truth" / "summary.json").write_text(
        json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    evidence = [
        ("requests", "canonical", ["evidence/requests-*.jsonl.gz"]),
        ("engine_legs", "canonical", ["evidence/engine_legs-*.parquet"]),
        ("pool_snapshots", "canonical", ["evidence/pool_snapshots.csv"]),
        ("tenants", "canonical", ["evidence/tenants.csv"]),
    ]
    if kv_allocations:
        evidence.append(("kv_allocations", "canonical", ["evidence/kv_allocations.parquet"]))
    if fmt != "canonical":
        from forensics.simulate import formats

        files, evidence = formats.rewrite(out, fmt, evidence)
        files.append(out / "evidence" / "tenants.csv")
    case_path = out / "case.toml"
    case_path.write_text(_manifest(cfg, seed, requests, evidence), encoding="utf-8")

    by_format: dict[str, int] = {}
    for f in files:
        ext = ".".join(f.name.split(".")[1:])
        by_format[ext] = by_format.get(ext, 0) + 1
    return SimulationSummary(
        out_dir=out,
        case_path=case_path,
        seed=seed,
        requests=n,
        affected=summary["affected"],
        affected_excluded=summary["affected_excluded"],
        exposures=summary["exposures"],
        recipient_tenants=summary["notify_recipient_tenants"],
        source_tenants=summary["notify_source_tenants"],
        files=dict(sorted(by_format.items())),
        profiles=summary["profiles"],
        probers={
            k: sum(p["requests"] for p in summary["probers"][k])
            for k in PROBER_STRATEGIES
            if k in summary["probers"]
        },
    )


class _Names:
    """String columns as polars Series, gathered by integer index (fast at 1M rows)."""

    def __init__(self, cfg: SimConfig, tenants, rid):
        import polars as pl

        from forensics.simulate import fleet

        self.model = cfg.model
        self.rid = pl.Series("request_id", rid).cast(pl.String)
        self.prefill = pl.Series(fleet.prefill_nodes(cfg), dtype=pl.String)
        self.decode = pl.Series(fleet.decode_nodes(cfg), dtype=pl.String)
        self.tenant = pl.Series(tenants.ids, dtype=pl.String)
        self.ua = pl.Series(tenants.uas, dtype=pl.String)
        self.width = max(len(k) for k in tenants.keys)
        self.keys = pl.Series(
            [k + [k[0]] * (self.width - len(k)) for k in tenants.keys], dtype=pl.List(pl.String)
        ).explode()

    def key(self, tenant, key_index):
        return self.keys.gather(tenant * self.width + key_index)


def _ip_strings(ip):
    import polars as pl

    s = pl.Series("ip", ip, dtype=pl.Int64)
    return pl.select(
        pl.format(
            "{}.{}.{}.{}", (s // 16777216) % 256, (s // 65536) % 256, (s // 256) % 256, s % 256
        )
    ).to_series()


def _null_where(values, mask, dtype):
    import polars as pl

    s = pl.Series(values)
    return pl.select(pl.when(pl.Series(mask)).then(None).otherwise(s).cast(dtype)).to_series()


def _write_requests(out, writer, names, tr, pl_, rid, first_token, completed):
    import numpy as np
    import polars as pl

    from forensics.simulate import fleet

    oc = pl_.outcome
    allocates = (oc == fleet.OK) | (oc == fleet.VICTIM)
    unrouted = oc == fleet.TOKENIZER_400
    status = np.where(allocates, 200, 400)
    finish = pl.Series(np.where(allocates, np.where(pl_.finish_length, 1, 2), 0)).replace_strict(
        [0, 1, 2], ["abort", "length", "stop"], return_dtype=pl.String
    )
    ttft = (first_token - tr.received_us) / 1000.0
    df = pl.DataFrame(
        {
            "request_id": rid,
            "tenant_id": names.tenant.gather(tr.tenant),
            "received_at": tr.received_us,
            "prompt_tokens": tr.prompt,
            "http_status": status,
            "completion_tokens": pl_.completion,
            "cached_tokens": np.where(allocates & (oc != fleet.VICTIM), tr.cached, 0),
            "first_token_at": _null_where(first_token, ~allocates, pl.Int64),
            "completed_at": completed,
            "ttft_ms": _null_where(ttft, ~allocates, pl.Float64),
            "e2e_ms": (completed - tr.received_us) / 1000.0,
            "finish_reason": _null_where(finish, unrouted, pl.String),
            "model": pl.repeat(names.model, len(rid), eager=True),
            "prefill_node": _null_where(names.prefill.gather(pl_.prefill), unrouted, pl.String),
            "decode_node": _null_where(names.decode.gather(pl_.decode), unrouted, pl.String),
            "dp_rank": _null_where(pl_.dp_rank, unrouted, pl.Int64),
            "bootstrap_room": _null_where(pl.Series(pl_.room).cast(pl.String), unrouted, pl.String),
            "api_key_id": names.key(tr.tenant, tr.key_index),
            "client_ip": _ip_strings(tr.ip),
            "user_agent": names.ua.gather(tr.tenant),
        }
    )
    return writer.write_requests(out, df)


def _labels(codes, labels: list[str]):
    """Small integer codes as a string Series (numpy string arrays convert slowly)."""
    import polars as pl

    return pl.Series(codes).replace_strict(list(range(len(labels))), labels, return_dtype=pl.String)


def _message(mask, template: str, *cols):
    """``template`` filled from ``cols`` where ``mask`` holds, null elsewhere."""
    import polars as pl

    args = [pl.Series(f"a{i}", c) for i, c in enumerate(cols)]
    return pl.select(
        pl.when(pl.Series(mask)).then(pl.format(template, *args)).otherwise(None)
    ).to_series()


REJECTION = (
    "Input length ({} tokens) exceeds the maximum allowed length ({} tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)
DECODE_CAPACITY = "Request {} exceeds the maximum number of tokens: {} > {}"


def _write_legs(
    out,
    writer,
    names,
    tr,
    pl_,
    rid,
    prefill_start,
    prefill_end,
    decode_want,
    decode_reject_end,
    alloc_at,
    free_at,
):
    import numpy as np
    import polars as pl

    from forensics.simulate import fleet

    n = len(rid)
    oc = pl_.outcome
    victim = oc == fleet.VICTIM
    normal = oc == fleet.OK
    over = tr.prompt >= pl_.threshold
    room = pl.Series(pl_.room).cast(pl.String)
    no_int = pl.Series([None] * n, dtype=pl.Int64)

    # Prefill legs: every request the tokenizer let through.
    has_p = oc != fleet.TOKENIZER_400
    aborted = (oc == fleet.PREFILL_400) | (oc == fleet.DECODE_400)
    prefill = pl.DataFrame(
        {
            "request_id": rid,
            "role": pl.repeat("prefill", n, eager=True),
            "node": names.prefill.gather(pl_.prefill),
            "started_at": prefill_start,
            "finished_at": prefill_end,
            "input_tokens": np.select(
                [normal, victim, oc == fleet.DECODE_400], [tr.prompt, 1, np.where(over, 1, 0)], 0
            ),
            "reserved_tokens": no_int,
            "transferred_tokens": np.select([normal, victim], [tr.prompt, 1], 0),
            "bootstrap_room": room,
            "dp_rank": no_int,
            # In PD every successful prefill ends as FINISH_LENGTH(0) once its KV is sent; that
            # also overwrites the pending abort of a rejected prompt (the bug).
            "finish_type": _labels(aborted.astype(np.int8), ["length", "abort"]),
            "status_code": np.where(aborted, 400, 200),
            "error": _message(has_p & over, REJECTION, tr.prompt, pl_.threshold),
        }
    ).filter(pl.Series(has_p))

    # Decode legs: allocations, plus the decode-side capacity rejections (nothing allocated).
    has_d = normal | victim | (oc == fleet.DECODE_400)
    d_rej = oc == fleet.DECODE_400
    decode = pl.DataFrame(
        {
            "request_id": rid,
            "role": pl.repeat("decode", n, eager=True),
            "node": names.decode.gather(pl_.decode),
            "started_at": np.where(d_rej, decode_want, alloc_at),
            "finished_at": np.where(d_rej, decode_reject_end, free_at),
            "input_tokens": tr.prompt,
            "reserved_tokens": np.where(d_rej, 0, tr.prompt),
            "transferred_tokens": np.select([normal, victim], [tr.prompt, 1], 0),
            "bootstrap_room": room,
            "dp_rank": pl_.dp_rank,
            "finish_type": _labels(
                np.where(d_rej, 0, np.where(pl_.finish_length, 1, 2)), ["abort", "length", "stop"]
            ),
            "status_code": np.where(d_rej, 400, 200),
            "error": _message(d_rej, DECODE_CAPACITY, rid, tr.prompt, pl_.decode_pool),
        }
    ).filter(pl.Series(has_d))

    ts = ["started_at", "finished_at"]
    paths = []
    for role, df in (("prefill", prefill), ("decode", decode)):
        df = df.sort(["started_at", "request_id"])
        paths.append(
            writer.write_parquet(
                out / "evidence" / f"engine_legs-{role}.parquet", df, "engine_legs", ts
            )
        )
    return paths


def _snapshot_instants(cfg: SimConfig) -> list[int]:
    start, end = cfg.us(cfg.start), cfg.us(cfg.end)
    step = int(cfg.snapshot_every_hours * 3600 * US)
    points = set(range(start, end, step))
    points |= {cfg.us(cfg.config_change_at), cfg.us(cfg.patch_at)}
    return sorted(p for p in points if start <= p < end)


def _write_snapshots(out, writer, cfg: SimConfig) -> Path:
    import polars as pl

    from forensics.simulate import fleet

    rows = []
    change, patch = cfg.us(cfg.config_change_at), cfg.us(cfg.patch_at)
    for t in _snapshot_instants(cfg):
        version = ENGINE_VERSION_AFTER if t >= patch else ENGINE_VERSION_BEFORE
        pools = cfg.prefill_pools_after if t >= change else cfg.prefill_pools
        for node, pool in zip(fleet.prefill_nodes(cfg), pools, strict=True):
            rows.append(
                (
                    node,
                    t,
                    pool,
                    "prefill",
                    max_req_input_len(pool, cfg.context_length),
                    cfg.context_length,
                    cfg.page_size,
                    1,
                    version,
                )
            )
        for node, pool, dp in zip(
            fleet.decode_nodes(cfg), cfg.decode_pools, cfg.decode_dp_sizes, strict=True
        ):
            rows.append(
                (
                    node,
                    t,
                    pool,
                    "decode",
                    max_req_input_len(pool, cfg.context_length),
                    cfg.context_length,
                    cfg.page_size,
                    dp,
                    version,
                )
            )
    cols = [
        "node",
        "observed_at",
        "max_total_num_tokens",
        "role",
        "max_req_input_len",
        "context_length",
        "page_size",
        "dp_size",
        "engine_version",
    ]
    df = pl.DataFrame(rows, schema=cols, orient="row").sort(["observed_at", "node"])
    return writer.write_csv(out / "evidence" / "pool_snapshots.csv", df, ["observed_at"])


def _write_tenants(out, writer, tenants) -> Path:
    import polars as pl

    df = pl.DataFrame(
        {"tenant_id": tenants.ids, "name": tenants.names, "contact": tenants.contacts}
    ).sort("tenant_id")
    return writer.write_csv(out / "evidence" / "tenants.csv", df, [])


def _write_kv(out, writer, names, rid, runs, rank_of_run, alloc_at, free_at) -> Path:
    import polars as pl

    frames = []
    for (req, first, count), (d, r) in zip(runs, rank_of_run, strict=True):
        base = pl.DataFrame(
            {
                "node": names.decode[d],
                "dp_rank": r,
                "request_id": rid.gather(req),
                "first_page": first,
                "page_count": count,
            }
        )
        for op, at, order in (("alloc", alloc_at[req], 1), ("free", free_at[req], 0)):
            frames.append(base.with_columns(op=pl.lit(op), at=pl.Series(at), _o=pl.lit(order)))
    df = pl.concat(frames).with_columns(pl.col("dp_rank").cast(pl.Int64))
    df = df.sort(["node", "dp_rank", "at", "_o", "request_id", "first_page"])
    return writer.write_parquet(
        out / "evidence" / "kv_allocations.parquet", df, "kv_allocations", ["at"]
    )


def _exclusions() -> list[dict]:
    from forensics.simulate import traffic as t

    return [
        {
            "name": "researcher",
            "reason": "Bug bounty reproduction traffic",
            "tenant_ids": [t.RESEARCHER_ID],
            "api_key_ids": [t.RESEARCHER_KEY],
        },
        {
            "name": "internal",
            "reason": "Internal canary and test traffic",
            "tenant_ids": [t.INTERNAL_ID],
            "api_key_ids": [t.INTERNAL_KEY],
            "user_agent_regex": "^kvf-canary/",
        },
    ]


def _write_truth(out, cfg, tenants, tr, pl_, rid, exposures, unwritten, seed, requests, waited):
    import numpy as np
    import polars as pl

    from forensics.simulate import fleet

    excluded_by = np.full(len(tenants.ids), "", dtype=object)
    excluded_by[tenants.researcher] = "researcher"
    excluded_by[tenants.internal] = "internal"
    tenant_ids = pl.Series(tenants.ids, dtype=pl.String)
    vic = np.flatnonzero(pl_.outcome == fleet.VICTIM)
    affected = pl.DataFrame(
        {
            "request_id": rid.gather(vic),
            "tenant_id": tenant_ids.gather(tr.tenant[vic]),
            "excluded_by": pl.Series(excluded_by[tr.tenant[vic]].tolist(), dtype=pl.String),
        }
    ).sort("request_id")
    affected.write_csv(out / "truth" / "affected.csv")

    ex = np.array(exposures, dtype=np.int64).reshape(-1, 3)
    expo = pl.DataFrame(
        {
            "recipient_request_id": rid.gather(ex[:, 0]),
            "source_request_id": rid.gather(ex[:, 1]),
            "source_tenant_id": tenant_ids.gather(tr.tenant[ex[:, 1]]),
            "pages": ex[:, 2],
        }
    ).sort(["recipient_request_id", "source_request_id"])
    expo.write_csv(out / "truth" / "exposures.csv")

    rec_tenants = tr.tenant[ex[:, 0]]
    customers = rec_tenants < tenants.researcher
    outcome_names = ["ok", "affected", "tokenizer_400", "prefill_400", "decode_400"]
    counts = np.bincount(pl_.outcome, minlength=5)
    summary = {
        "seed": seed,
        "requests": int(len(rid)),
        "outcomes": {name: int(c) for name, c in zip(outcome_names, counts, strict=True)},
        "affected": int(len(vic)),
        "affected_excluded": int((excluded_by[tr.tenant[vic]] != "").sum()),
        "affected_by_exclusion": {
            name: int((excluded_by[tr.tenant[vic]] == name).sum())
            for name in ("researcher", "internal")
        },
        "affected_customer_tenants": int(
            len(np.unique(tr.tenant[vic][tr.tenant[vic] < tenants.researcher]))
        ),
        "exposures": int(len(ex)),
        "exposed_pages": int(ex[:, 2].sum()),
        "stale_pages_never_written": int(unwritten),
        "decode_prealloc_waits": waited,
        "recipients_with_exposure": int(len(np.unique(ex[:, 0]))),
        "recipient_customer_tenants": int(len(np.unique(rec_tenants[customers]))),
        "source_tenants": int(len(np.unique(tr.tenant[ex[:, 1]]))),
        "source_customer_tenants": int(
            len(np.unique(tr.tenant[ex[:, 1]][tr.tenant[ex[:, 1]] < tenants.researcher]))
        ),
        # The report's definitions: customers with an affected response (excluded traffic
        # left out), and customers whose request another tenant's affected response read.
        "notify_recipient_tenants": int(
            len(np.unique(tr.tenant[vic][tr.tenant[vic] < tenants.researcher]))
        ),
        "notify_source_tenants": int(
            len(
                np.unique(
                    tr.tenant[ex[:, 1]][
                        (tr.tenant[ex[:, 1]] < tenants.researcher)
                        & (tr.tenant[ex[:, 1]] != tr.tenant[ex[:, 0]])
                    ]
                )
            )
        ),
        "tenants": len(tenants.ids),
        "parameters": {
            "requests_asked": requests,
            "start": cfg.start.isoformat(),
            "end": cfg.end.isoformat(),
            "page_size": cfg.page_size,
            "context_length": cfg.context_length,
            "model": cfg.model,
            "prefill_pools": list(cfg.prefill_pools),
            "prefill_pools_after": list(cfg.prefill_pools_after),
            "decode_dp_sizes": list(cfg.decode_dp_sizes),
            "decode_pools_per_rank": list(cfg.decode_pools),
            "config_change_at": cfg.config_change_at.isoformat(),
            "patch_at": cfg.patch_at.isoformat(),
            "report_at": cfg.report_at.isoformat(),
            "agentic_share": cfg.agentic_share,
            "longctx_share": cfg.longctx_share,
            "docqa_tenants": cfg.docqa_tenants,
            "long_context_fraction": cfg.long_context_fraction,
            "probers": list(cfg.probers),
        },
    }
    return summary


def _write_actors(out, cfg, tenants, tr, pl_, rid, session_stats, prober_stats) -> dict:
    """Who each tenant is, each long-context request's session, each prober request's phase.

    Returns:
        The summary's ``profiles``, ``deliberate_tenants``, ``sessions`` and ``probers``.
    """
    import numpy as np
    import polars as pl

    from forensics.simulate import fleet, traffic

    n_t = len(tenants.ids)
    strategy = [tenants.strategy(i) for i in range(n_t)]
    strategy[tenants.researcher] = "researcher"
    deliberate = [bool(s) for s in strategy]
    pl.DataFrame(
        {
            "tenant_id": tenants.ids,
            "profile": tenants.profiles,
            "deliberate": deliberate,
            "strategy": pl.Series([s or None for s in strategy], dtype=pl.String),
        }
    ).sort("tenant_id").write_csv(out / "truth" / "tenants.csv")

    tenant_ids = pl.Series(tenants.ids, dtype=pl.String)
    profiles = pl.Series(tenants.profiles, dtype=pl.String)
    ses = np.flatnonzero(tr.session >= 0)
    df = pl.DataFrame(
        {
            "i": ses,
            "session": tr.session[ses],
            "turn": tr.turn[ses],
            "attempt": tr.attempt[ses],
            "parent": tr.parent[ses],
            "added_tokens": tr.added[ses],
            "received_us": tr.received_us[ses],
            "prompt": tr.prompt[ses],
            "tenant": tr.tenant[ses],
        }
    )
    # The answered attempt of each turn is its last one (earlier attempts were refused).
    answered = df.group_by(["session", "turn"]).agg(
        pl.col("i").sort_by("attempt").last().alias("p")
    )
    df = df.join(answered.rename({"turn": "parent"}), on=["session", "parent"], how="left").sort(
        ["session", "turn", "attempt"]
    )
    pl.DataFrame(
        {
            "request_id": rid.gather(df["i"]),
            "tenant_id": tenant_ids.gather(df["tenant"]),
            "profile": profiles.gather(df["tenant"]),
            "session": df["session"],
            "turn": df["turn"],
            "attempt": df["attempt"],
            "parent_request_id": rid.gather(df["p"]),  # null index: no parent
            "added_tokens": df["added_tokens"],
        }
    ).write_csv(out / "truth" / "sessions.csv")

    # Sessions that grow across the undersized prefill's limit: a turn below it, a later one
    # at or above it.
    limit = max_req_input_len(SMALL_PREFILL_POOL, cfg.context_length)
    per = df.group_by("session").agg(
        pl.col("tenant").first(),
        pl.col("received_us").filter(pl.col("prompt") < limit).min().alias("below"),
        pl.col("received_us").filter(pl.col("prompt") >= limit).max().alias("over"),
    )
    crossing = per.filter(pl.col("over") > pl.col("below"))
    sess_summary = {}
    for profile, st in sorted(session_stats.items()):
        in_profile = crossing.filter(profiles.gather(crossing["tenant"]) == profile)
        sess_summary[profile] = {**st, "crossing_limit": in_profile.height}

    phase = np.flatnonzero(tr.phase > 0)
    phase = phase[np.lexsort((tr.received_us[phase], tr.tenant[phase]))]
    pl.DataFrame(
        {
            "request_id": rid.gather(phase),
            "tenant_id": tenant_ids.gather(tr.tenant[phase]),
            "strategy": pl.Series(
                [strategy[t] for t in tr.tenant[phase].tolist()], dtype=pl.String
            ),
            "phase": pl.Series(tr.phase[phase]).replace_strict(
                [1, 2], ["probe", "exploit"], return_dtype=pl.String
            ),
        }
    ).write_csv(out / "truth" / "probes.csv")
    victim = pl_.outcome == fleet.VICTIM
    prober_summary: dict[str, list[dict]] = {}
    for st in prober_stats:
        mine = tr.tenant == st.tenant
        prober_summary.setdefault(st.strategy, []).append(
            {
                "tenant_id": tenants.ids[st.tenant],
                "requests": st.requests,
                "probes": st.probes,
                "exploits": st.exploits,
                "affected": int((victim & mine & (tr.phase > 0)).sum()),
                "ordinary_requests": int((mine & (tr.phase == 0)).sum()),
            }
        )
    long_tenants = [i for i, p in enumerate(tenants.profiles) if p in traffic.LONG_PROFILES]
    counts: dict[str, int] = {}
    for p in tenants.profiles:
        counts[p] = counts.get(p, 0) + 1
    return {
        "profiles": dict(sorted(counts.items())),
        "deliberate_tenants": sum(deliberate),
        "sessions": sess_summary,
        "probers": prober_summary,
        "long_context_requests": int(np.isin(tr.tenant, long_tenants).sum()),
    }


def _manifest(cfg: SimConfig, seed: int, requests: int, evidence) -> str:
    from forensics.simulate import writer

    changed = [
        f"prefill-{i}"
        for i, (a, b) in enumerate(zip(cfg.prefill_pools, cfg.prefill_pools_after, strict=True))
        if a != b
    ]
    change_text = ", ".join(
        f"prefill-{i} {a:,} -> {b:,}"
        for i, (a, b) in enumerate(zip(cfg.prefill_pools, cfg.prefill_pools_after, strict=True))
        if a != b
    )
    timeline = [
        (cfg.report_at, "Report received through the bug bounty programme", False),
        (
            cfg.config_change_at,
            f"Prefill KV pools enlarged on {', '.join(changed) or 'no node'} ({change_text} tokens)"
            if changed
            else "Prefill configuration reviewed (no pool changed)",
            False,
        ),
        (
            cfg.patch_at,
            f"Engine {ENGINE_VERSION_AFTER} deployed: prompts rejected at prefill "
            "intake are no longer admitted to the PD handoff (HTTP 400)",
            True,
        ),
    ]
    return writer.case_toml(
        case_id=f"INC-SIM-{seed}",
        title=f"Simulated cross-tenant KV cache exposure (seed {seed}, {requests:,} requests)",
        model=cfg.model,
        start=cfg.start,
        end=cfg.end,
        as_of=writer.as_of_for(cfg.end),
        context_length=cfg.context_length,
        evidence=evidence,
        exclusions=_exclusions(),
        timeline=timeline,
    )
