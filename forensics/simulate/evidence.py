"""The simulated case's evidence files and manifest: requests, engine legs, pool snapshots,
tenants and the allocator log, as canonical files (``writer`` picks the file formats), and the
``case.toml`` that names them."""

from __future__ import annotations

from pathlib import Path

from forensics.simulate.config import (
    ENGINE_VERSION_AFTER,
    ENGINE_VERSION_BEFORE,
    US,
    SimConfig,
    max_req_input_len,
)


class Names:
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


def write_requests(out, writer, names, tr, pl_, rid, first_token, completed):
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


def write_legs(
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


def write_snapshots(out, writer, cfg: SimConfig) -> Path:
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


def write_tenants(out, writer, tenants) -> Path:
    import polars as pl

    df = pl.DataFrame(
        {"tenant_id": tenants.ids, "name": tenants.names, "contact": tenants.contacts}
    ).sort("tenant_id")
    return writer.write_csv(out / "evidence" / "tenants.csv", df, [])


def write_kv(out, writer, names, rid, runs, rank_of_run, alloc_at, free_at) -> Path:
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


def manifest_text(cfg: SimConfig, seed: int, requests: int, evidence) -> str:
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
