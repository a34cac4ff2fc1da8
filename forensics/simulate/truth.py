"""The simulated case's ground truth (``truth/``): which requests were affected, whose KV
each read, who each tenant is, which sessions and probes each request belongs to, and the
headline counts, all from the simulation itself."""

from __future__ import annotations

from forensics.simulate.config import SMALL_PREFILL_POOL, max_req_input_len


def write_truth(out, cfg, tenants, tr, pl_, rid, exposures, unwritten, seed, requests, waited):
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


def write_actors(out, cfg, tenants, tr, pl_, rid, session_stats, prober_stats) -> dict:
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
