"""The simulation, step by step: traffic, request ids, the fleet and its decode allocators,
the instants of every leg, then the evidence, the truth and the manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from forensics.errors import ForensicsError
from forensics.simulate.config import (
    PROBER_STRATEGIES,
    SMALL_PREFILL_POOL,
    make_config,
    max_req_input_len,
)

FORMATS = ("canonical", "sglang", "otel", "litellm")


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
        **config: any ``SimConfig`` field, e.g. ``page_size=32`` or ``decode_dp_sizes=(1, 1)``
            with ``decode_pools=(983_040, 1_245_184)``.

    Returns:
        Counts and the files written.

    Raises:
        ForensicsError: an unknown format or setting, or too few requests.
    """
    import numpy as np

    from forensics.simulate import fleet, writer
    from forensics.simulate.evidence import (
        Names,
        manifest_text,
        write_kv,
        write_legs,
        write_requests,
        write_snapshots,
        write_tenants,
    )
    from forensics.simulate.truth import write_actors, write_truth

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
    tenants, tr, session_stats, prober_stats = _traffic(
        cfg, requests, r_ten, r_int, r_res, r_cust, r_sess, r_probe
    )
    n = len(tr.received_us)
    rid_rank, raw_ids = _request_ids(r_ids, n)

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
    alloc_at, exposures, unwritten, runs, rank_of_run = _decode_allocators(
        cfg, tr, pl_, rid_rank, decode_want, allocates, victim, kv_allocations
    )

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

    names = Names(cfg, tenants, raw_ids)
    rid = names.rid
    out.mkdir(parents=True, exist_ok=True)
    (out / "evidence").mkdir(exist_ok=True)
    (out / "truth").mkdir(exist_ok=True)
    writer.clear_previous(out)

    files: list[Path] = []
    files += write_requests(out, writer, names, tr, pl_, rid, first_token, completed)
    files += write_legs(
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
    files.append(write_snapshots(out, writer, cfg))
    files.append(write_tenants(out, writer, tenants))
    if kv_allocations:
        files.append(write_kv(out, writer, names, rid, runs, rank_of_run, alloc_at, free_at))

    # --- truth ---------------------------------------------------------------------------
    # Allocations that queued for pages (their decode start moved later than wanted).
    waited = int(((alloc_at - decode_want) > 1000)[allocates].sum())
    summary = write_truth(
        out, cfg, tenants, tr, pl_, rid, exposures, unwritten, seed, requests, waited
    )
    summary.update(write_actors(out, cfg, tenants, tr, pl_, rid, session_stats, prober_stats))
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

        handshake = dict(zip(rid.to_list(), pl_.handshake.tolist(), strict=True))
        files, evidence = formats.rewrite(out, fmt, evidence, handshake)
        files.append(out / "evidence" / "tenants.csv")
    case_path = out / "case.toml"
    case_path.write_text(manifest_text(cfg, seed, requests, evidence), encoding="utf-8")

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


def _traffic(cfg, requests, r_ten, r_int, r_res, r_cust, r_sess, r_probe):
    """Every client request: tenants, our canaries, the researcher, probers, long-context
    sessions, then short-prompt customers filling the rest; with the sessions' and probers'
    own accounts."""
    from forensics.simulate import probers, sessions, traffic

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
    return tenants, tr, session_stats, prober_stats


def _request_ids(r_ids, n: int):
    """Each request's id (bytes) and its rank in id order."""
    import numpy as np

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
    return rid_rank, raw_ids


def _decode_allocators(cfg, tr, pl_, rid_rank, decode_want, allocates, victim, kv_allocations):
    """Run each decode rank's page allocator over the requests it served: when each took its
    pages, whose stale pages each victim read, and (optionally) the page runs for the log."""
    import numpy as np

    from forensics.simulate import allocator

    alloc_at = np.full(len(tr.received_us), -1, dtype=np.int64)
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
    return alloc_at, exposures, unwritten, runs, rank_of_run
