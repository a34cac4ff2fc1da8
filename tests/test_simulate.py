"""The simulator's invariants, checked against the files it writes.

The reference replay below re-implements the decode allocator from the written evidence alone;
it must reproduce the simulator's truth exactly, which is what a detector replaying the same
evidence relies on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from forensics.case import load_case
from forensics.schema import columns
from forensics.simulate import simulate_case

SETTINGS = {"long_context_fraction": 0.03}


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "case"
    simulate_case(out, requests=6000, seed=11, kv_allocations=True, **SETTINGS)
    return out


def _us(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("us")


def load(case: Path) -> dict[str, pl.DataFrame]:
    ts = ["received_at", "first_token_at", "completed_at"]
    req = pl.concat(
        [
            pl.read_ndjson(p, infer_schema_length=None)
            for p in sorted((case / "evidence").glob("requests-*.jsonl.gz"))
        ],
        how="vertical_relaxed",
    ).with_columns(
        [pl.col(c).str.to_datetime("%Y-%m-%dT%H:%M:%S%.fZ", time_zone="UTC") for c in ts]
    )
    legs = pl.concat(
        [pl.read_parquet(p) for p in sorted((case / "evidence").glob("engine_legs-*.parquet"))]
    )
    snaps = pl.read_csv(case / "evidence" / "pool_snapshots.csv").with_columns(
        pl.col("observed_at").str.to_datetime("%Y-%m-%dT%H:%M:%S%.fZ", time_zone="UTC")
    )
    out = {
        "requests": req,
        "legs": legs,
        "snaps": snaps,
        "tenants": pl.read_csv(case / "evidence" / "tenants.csv"),
        "affected": pl.read_csv(
            case / "truth" / "affected.csv", schema_overrides={"excluded_by": pl.String}
        ),
        "exposures": pl.read_csv(case / "truth" / "exposures.csv"),
        "summary": json.loads((case / "truth" / "summary.json").read_text()),
    }
    kv = case / "evidence" / "kv_allocations.parquet"
    if kv.exists():
        out["kv"] = pl.read_parquet(kv)
    return out


@pytest.fixture(scope="module")
def ev(case) -> dict[str, pl.DataFrame]:
    return load(case)


def test_manifest_loads_and_names_every_evidence_file(case):
    c = load_case(case / "case.toml")
    assert c.context_length == 1_048_576 and c.timezone == "UTC" and c.as_of is not None
    assert c.detection.default_pool_tokens == 681_280
    assert {e.name for e in c.exclusions} == {"researcher", "internal"}
    kinds = {e.kind for e in c.evidence}
    assert kinds == {"requests", "engine_legs", "pool_snapshots", "tenants", "kv_allocations"}
    for e in c.evidence:
        assert e.files() and all(f.exists() for f in e.files())
    assert len(c.timeline) == 3
    assert not (case / "case.duckdb").exists()


def test_files_carry_exactly_the_canonical_columns(ev):
    assert ev["requests"].columns == [c.name for c in columns("requests")]
    assert ev["legs"].columns == [c.name for c in columns("engine_legs")]
    assert ev["snaps"].columns == [c.name for c in columns("pool_snapshots")]
    assert ev["tenants"].columns == [c.name for c in columns("tenants")]
    assert ev["kv"].columns == [c.name for c in columns("kv_allocations")]
    assert ev["requests"]["request_id"].n_unique() == ev["requests"].height == 6000


def _threshold_and_pool(ev) -> pl.DataFrame:
    """Requests joined with the prefill threshold and decode rank pool in force at arrival."""
    snaps = ev["snaps"].sort("observed_at")
    req = ev["requests"].filter(pl.col("prefill_node").is_not_null()).sort("received_at")
    pre = snaps.filter(pl.col("role") == "prefill").select(
        pl.col("node").alias("prefill_node"), "observed_at", "max_req_input_len"
    )
    dec = snaps.filter(pl.col("role") == "decode").select(
        pl.col("node").alias("decode_node"),
        pl.col("observed_at").alias("dec_at"),
        pl.col("max_total_num_tokens").alias("decode_pool"),
    )
    out = req.join_asof(
        pre,
        left_on="received_at",
        right_on="observed_at",
        by="prefill_node",
        strategy="backward",
        check_sortedness=False,
    )
    return out.join_asof(
        dec,
        left_on="received_at",
        right_on="dec_at",
        by="decode_node",
        strategy="backward",
        check_sortedness=False,
    )


def test_affected_are_exactly_the_rule(ev):
    patch = pl.lit(ev["summary"]["parameters"]["patch_at"]).str.to_datetime(time_zone="UTC")
    df = _threshold_and_pool(ev)
    assert df["max_req_input_len"].null_count() == 0
    rule = df.filter(
        (pl.col("prompt_tokens") >= pl.col("max_req_input_len"))
        & (pl.col("prompt_tokens") < 1_048_576)
        & (pl.col("prompt_tokens") <= pl.col("decode_pool"))
        & (pl.col("received_at") < patch)
    )
    truth = set(ev["affected"]["request_id"])
    assert set(rule["request_id"]) == truth
    assert len(truth) >= 10
    assert set(rule["http_status"]) == {200}
    # Nothing else over the threshold succeeded.
    over = df.filter(pl.col("prompt_tokens") >= pl.col("max_req_input_len"))
    assert set(over.filter(pl.col("http_status") == 200)["request_id"]) == truth


def test_code_paths_leave_the_right_records(ev):
    req, legs = ev["requests"], ev["legs"]
    truth = set(ev["affected"]["request_id"])
    p = legs.filter(pl.col("role") == "prefill")
    d = legs.filter(pl.col("role") == "decode")
    vp = p.filter(pl.col("request_id").is_in(truth))
    assert vp.height == len(truth)
    assert (vp["input_tokens"] == 1).all() and (vp["transferred_tokens"] == 1).all()
    assert vp["error"].str.starts_with("Input length (").all()
    assert (vp["finish_type"] == "length").all()
    vd = d.filter(pl.col("request_id").is_in(truth)).join(req, on="request_id")
    assert (vd["reserved_tokens"] == vd["prompt_tokens"]).all()
    assert (vd["transferred_tokens"] == 1).all()
    normal = d.filter(~pl.col("request_id").is_in(truth) & (pl.col("status_code") == 200))
    assert (normal["reserved_tokens"] == normal["transferred_tokens"]).all()
    # Tokenizer refusals: client row only.
    too_long = req.filter(pl.col("prompt_tokens") >= 1_048_576)
    assert (too_long["http_status"] == 400).all()
    assert not set(too_long["request_id"]) & set(legs["request_id"])
    # Decode capacity refusals: a decode leg that allocated nothing, a 400 to the client.
    rej = d.filter(pl.col("status_code") == 400)
    assert rej.height > 0 and (rej["reserved_tokens"] == 0).all()
    assert rej["error"].str.contains("exceeds the maximum number of tokens").all()
    # Victims answer fast unless they queued for decode pages (a decode leg starts when its
    # pages are allocated); normal prompts of similar length take minutes.
    queued = vd.filter(_us("started_at") - _us("received_at") > 1_000_000)["request_id"]
    vr = req.filter(pl.col("request_id").is_in(truth))
    long_ok = req.filter(
        ~pl.col("request_id").is_in(truth)
        & (pl.col("http_status") == 200)
        & (pl.col("prompt_tokens") > 600_000)
    )
    unqueued = vr.filter(~pl.col("request_id").is_in(queued.implode()))
    assert unqueued.height >= 0.8 * vr.height
    fast = (unqueued["ttft_ms"] < 0.2 * long_ok["ttft_ms"].min()).mean()
    assert fast >= 0.9
    ok = req.filter(pl.col("http_status") == 200)
    assert (ok["first_token_at"] > ok["received_at"]).all()
    assert (ok["completed_at"] > ok["first_token_at"]).all()


def test_exclusions_mark_researcher_and_internal(ev):
    aff = ev["affected"].with_columns(pl.col("excluded_by").fill_null(""))
    by = dict(zip(aff["tenant_id"], aff["excluded_by"], strict=True))
    assert by.get("acct_researcher") == "researcher"
    assert by.get("acct_internal") == "internal"
    customers = aff.filter(~pl.col("tenant_id").is_in(["acct_researcher", "acct_internal"]))
    assert (customers["excluded_by"] == "").all() and customers.height > 0
    req = ev["requests"]
    internal = req.filter(pl.col("tenant_id") == "acct_internal")
    assert set(internal["api_key_id"]) == {"key_internal_canary"}
    assert internal["user_agent"].str.starts_with("kvf-canary/").all()
    research = req.filter(pl.col("tenant_id") == "acct_researcher")
    assert research["client_ip"].str.starts_with("203.0.113.").all()


def test_truth_agrees_with_the_evidence(ev):
    req, legs, expo = ev["requests"], ev["legs"], ev["exposures"]
    d = legs.filter((pl.col("role") == "decode") & (pl.col("status_code") == 200))
    thr = _threshold_and_pool(ev).select("request_id", "max_req_input_len")
    rec = ev["affected"].join(req, on="request_id").join(thr, on="request_id")
    assert (rec["http_status"] == 200).all()
    assert (rec["prompt_tokens"] >= rec["max_req_input_len"]).all()
    assert expo.height > 0
    assert set(expo["recipient_request_id"]) <= set(ev["affected"]["request_id"])
    a = d.select(
        pl.col("request_id").alias("recipient_request_id"),
        pl.col("node").alias("r_node"),
        pl.col("dp_rank").alias("r_rank"),
        pl.col("started_at").alias("r_alloc"),
    )
    s = d.select(
        pl.col("request_id").alias("source_request_id"),
        pl.col("node").alias("s_node"),
        pl.col("dp_rank").alias("s_rank"),
        pl.col("finished_at").alias("s_free"),
    )
    j = expo.join(a, on="recipient_request_id", how="left").join(
        s, on="source_request_id", how="left"
    )
    assert j["s_node"].null_count() == 0  # every source exists and allocated
    assert (j["r_node"] == j["s_node"]).all() and (j["r_rank"] == j["s_rank"]).all()
    assert (j["s_free"] <= j["r_alloc"]).all()
    assert (j["source_request_id"] != j["recipient_request_id"]).all()
    tenants = req.select(
        pl.col("request_id").alias("source_request_id"), pl.col("tenant_id").alias("t")
    )
    j = j.join(tenants, on="source_request_id")
    assert (j["t"] == j["source_tenant_id"]).all()
    # Each stale page has one last writer: pages per recipient never exceed its stale span.
    per = (
        expo.group_by("recipient_request_id")
        .agg(pl.col("pages").sum())
        .join(
            req.select(pl.col("request_id").alias("recipient_request_id"), "prompt_tokens"),
            on="recipient_request_id",
        )
    )
    assert (per["pages"] <= (per["prompt_tokens"] + 63) // 64 - 1).all()
    assert ev["summary"]["affected"] == ev["affected"].height
    assert ev["summary"]["exposures"] == expo.height


def _replay(ev, page_size: int = 64):
    """Independent replay of every decode rank from the written decode legs."""
    req = ev["requests"].select("request_id", "prompt_tokens", "completion_tokens")
    p = (
        ev["legs"]
        .filter(pl.col("role") == "prefill")
        .select("request_id", pl.col("input_tokens").alias("p_in"))
    )
    d = (
        ev["legs"]
        .filter((pl.col("role") == "decode") & (pl.col("reserved_tokens") > 0))
        .join(req, on="request_id")
        .join(p, on="request_id")
        .with_columns(_us("started_at").alias("a"), _us("finished_at").alias("f"))
    )
    pools = dict(
        ev["snaps"]
        .filter(pl.col("role") == "decode")
        .select("node", "max_total_num_tokens")
        .unique()
        .iter_rows()
    )
    exposures, allocations = {}, {}
    for (node, rank), g in d.group_by(["node", "dp_rank"], maintain_order=True):
        events = []
        for r in g.iter_rows(named=True):
            events.append((r["a"], 1, r["request_id"], r))
            events.append((r["f"], 0, r["request_id"], r))
        events.sort(key=lambda e: e[:3])
        n_pages = pools[node] // page_size
        free, release, held, writer = list(range(1, n_pages + 1)), [], {}, {}
        for _, op, rid, r in events:
            if op == 0:
                release = sorted(set(held.pop(rid))) + release
                continue
            n = -(-(r["prompt_tokens"] + r["completion_tokens"]) // page_size)
            if n > len(free):
                free, release = sorted(free + release), []
            assert n <= len(free), "the written timestamps must never overcommit a rank"
            pages, free = free[:n], free[n:]
            held[rid] = pages
            allocations[rid] = (node, rank, pages)
            if r["p_in"] == 1:  # prefill computed one token: the prompt KV never arrived
                stale = -(-r["prompt_tokens"] // page_size)
                for pg in pages[1:stale]:
                    if pg in writer:
                        key = (rid, writer[pg])
                        exposures[key] = exposures.get(key, 0) + 1
                for pg in [pages[0], *pages[r["prompt_tokens"] // page_size :]]:
                    writer[pg] = rid
            else:
                for pg in pages:
                    writer[pg] = rid
    return exposures, allocations


def test_allocator_replay_from_evidence_reproduces_truth(ev):
    exposures, allocations = _replay(ev)
    truth = {
        (a, b): c
        for a, b, c in ev["exposures"]
        .select("recipient_request_id", "source_request_id", "pages")
        .iter_rows()
    }
    assert exposures == truth
    # The allocation log lists the same pages, one row per contiguous run.
    kv = ev["kv"].filter(pl.col("op") == "alloc").sort(["request_id", "first_page"])
    logged = {}
    for rid, first, count in kv.select("request_id", "first_page", "page_count").iter_rows():
        logged.setdefault(rid, []).extend(range(first, first + count))
    assert logged.keys() == allocations.keys()
    for rid, (_, _, pages) in allocations.items():
        assert sorted(logged[rid]) == pages
    frees = ev["kv"].filter(pl.col("op") == "free")
    assert frees.height == kv.height


def test_same_seed_same_bytes_and_other_seed_differs(case, tmp_path):
    def digest(folder: Path) -> dict[str, str]:
        return {
            str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }

    again = tmp_path / "again"
    simulate_case(again, requests=6000, seed=11, kv_allocations=True, **SETTINGS)
    assert digest(again) == digest(case)
    other = tmp_path / "other"
    simulate_case(other, requests=6000, seed=12, kv_allocations=True, **SETTINGS)
    d1, d2 = digest(other), digest(case)
    assert d1["truth/affected.csv"] != d2["truth/affected.csv"]
    assert d1["evidence/engine_legs-decode.parquet"] != d2["evidence/engine_legs-decode.parquet"]


def test_after_the_patch_over_length_prompts_get_400_without_decode(tmp_path):
    simulate_case(
        tmp_path, requests=3000, seed=5, patch_at="2026-09-02T00:00:00Z", long_context_fraction=0.05
    )
    ev = load(tmp_path)
    summary = ev["summary"]
    assert summary["outcomes"]["prefill_400"] > 0
    p = ev["legs"].filter(
        (pl.col("role") == "prefill")
        & (pl.col("status_code") == 400)
        & pl.col("error").str.starts_with("Input length")
    )
    late = p.filter(
        pl.col("started_at") >= pl.lit("2026-09-02T00:00:00Z").str.to_datetime(time_zone="UTC")
    )
    assert late.height > 0
    decode_ids = set(ev["legs"].filter(pl.col("role") == "decode")["request_id"])
    assert not set(late["request_id"]) & decode_ids
    client = ev["requests"].filter(pl.col("request_id").is_in(late["request_id"].to_list()))
    assert (client["http_status"] == 400).all()


def test_cli_writes_a_case_and_rejects_other_formats(tmp_path):
    from forensics.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["simulate", str(tmp_path / "c"), "--requests", "1000", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "affected" in res.output
    assert (tmp_path / "c" / "case.toml").exists()
    assert not (tmp_path / "c" / "evidence" / "kv_allocations.parquet").exists()
    res = runner.invoke(app, ["simulate", str(tmp_path / "d"), "--format", "helicone"])
    assert res.exit_code == 2
    assert not (tmp_path / "d").exists()


def test_library_rejects_unknown_settings(tmp_path):
    from forensics.errors import ForensicsError

    with pytest.raises(ForensicsError, match="unknown setting"):
        simulate_case(tmp_path, requests=500, no_such_knob=1)
    with pytest.raises(ForensicsError, match="format 'helicone' .supported: canonical, sglang,"):
        simulate_case(tmp_path, requests=500, fmt="helicone")
    # A shorter case must move the researcher's bursts into it, or have none.
    with pytest.raises(ForensicsError, match="researcher's bursts .* must fall within"):
        simulate_case(tmp_path, requests=500, days=3)
    folder = tmp_path / "short"
    simulate_case(folder, requests=500, days=3, researcher_bursts=0)
    assert "2026-08-30T00:00:00Z" in (folder / "case.toml").read_text()
