"""The simulator's traffic: long-context sessions, deliberate probers and their ground truth.

Sessions are checked against the written evidence (a continuation's prompt is its parent's
prompt plus the completion the client received plus what was added); probers by the shape of
their requests; the truth by listing every tenant once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from forensics.errors import ForensicsError
from forensics.simulate import simulate_case
from forensics.simulate.config import make_config, max_req_input_len

LIMIT = max_req_input_len(681_280, 1_048_576)  # 681,274: the undersized prefill nodes
STRATEGIES = ("binary_search", "sweep", "repeat", "slow")
BAD_NAME = "unknown prober strategy 'bisect' (choose from: binary_search, sweep, repeat, slow)"


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("traffic") / "case"
    simulate_case(out, requests=8000, seed=4, long_context_fraction=0.05, probers=STRATEGIES)
    return out


@pytest.fixture(scope="module")
def ev(case) -> dict[str, pl.DataFrame]:
    import json

    req = pl.concat(
        [
            pl.read_ndjson(p, infer_schema_length=None)
            for p in sorted((case / "evidence").glob("requests-*.jsonl.gz"))
        ],
        how="vertical_relaxed",
    ).with_columns(
        pl.col(c).str.to_datetime("%Y-%m-%dT%H:%M:%S%.fZ", time_zone="UTC")
        for c in ("received_at", "first_token_at", "completed_at")
    )
    truth = case / "truth"
    return {
        "requests": req,
        "tenants": pl.read_csv(truth / "tenants.csv", schema_overrides={"strategy": pl.String}),
        "evidence_tenants": pl.read_csv(case / "evidence" / "tenants.csv"),
        "sessions": pl.read_csv(truth / "sessions.csv"),
        "probes": pl.read_csv(truth / "probes.csv"),
        "affected": pl.read_csv(truth / "affected.csv"),
        "summary": json.loads((truth / "summary.json").read_text()),
    }


def test_truth_lists_every_tenant_once_with_its_profile_and_intent(ev):
    t = ev["tenants"]
    assert t.columns == ["tenant_id", "profile", "deliberate", "strategy"]
    assert t["tenant_id"].n_unique() == t.height == ev["evidence_tenants"].height
    assert set(t["tenant_id"]) == set(ev["evidence_tenants"]["tenant_id"])
    assert set(ev["requests"]["tenant_id"]) <= set(t["tenant_id"])
    profiles = {"chat", "code", "rag", "agentic", "longctx", "docqa", "researcher", "internal"}
    assert set(t["profile"]) == profiles
    deliberate = t.filter(pl.col("deliberate"))
    assert sorted(deliberate["strategy"]) == sorted([*STRATEGIES, "researcher"])
    assert t.filter(~pl.col("deliberate"))["strategy"].null_count() == t.height - len(deliberate)
    # Probers are customer accounts with ordinary profiles, not a profile of their own.
    probers = deliberate.filter(pl.col("strategy") != "researcher")
    assert set(probers["profile"]) <= {"chat", "code", "rag"}
    assert not probers["tenant_id"].str.contains("researcher|internal").any()
    s = ev["summary"]
    assert s["profiles"] == dict(t.group_by("profile").len().iter_rows())
    assert s["deliberate_tenants"] == deliberate.height
    assert sorted(s["probers"]) == sorted(STRATEGIES)


def test_every_continuation_holds_the_previous_prompt_and_the_answer_received(ev):
    req = ev["requests"].select(
        "request_id", "prompt_tokens", "completion_tokens", "http_status", "received_at"
    )
    ses = ev["sessions"].join(req, on="request_id")
    assert ses.height == ev["sessions"].height
    parent = req.select(
        pl.col("request_id").alias("parent_request_id"),
        pl.col("prompt_tokens").alias("p_prompt"),
        pl.col("completion_tokens").alias("p_completion"),
        pl.col("http_status").alias("p_status"),
    )
    cont = ses.filter(pl.col("parent_request_id").is_not_null()).join(
        parent, on="parent_request_id"
    )
    assert cont.height == ses["parent_request_id"].drop_nulls().len()
    assert set(cont["profile"]) == {"longctx", "agentic"}
    assert cont.filter(pl.col("profile") == "longctx").height >= 20
    assert cont.filter(pl.col("profile") == "agentic").height >= 50
    grown = cont["p_prompt"] + cont["p_completion"] + cont["added_tokens"]
    assert (cont["prompt_tokens"] == grown).all()
    assert (cont["p_status"] == 200).all()  # only an answered turn is continued
    # A few hundred tokens apart in conversations (a user's message and the answer), tool
    # results of up to tens of thousands in agents.
    step = cont["prompt_tokens"] - cont["p_prompt"]
    assert (step > 0).all()
    assert (cont.filter(pl.col("profile") == "longctx")["added_tokens"].median() or 0) < 1_000
    assert cont.filter(pl.col("profile") == "agentic")["added_tokens"].max() > 5_000
    # Openings: a session's first turn, a re-asked opening, an agent restarting after
    # compaction; and docqa questions, which continue nothing.
    assert ses.filter(pl.col("profile") == "docqa")["parent_request_id"].null_count() == (
        ses.filter(pl.col("profile") == "docqa").height
    )


def test_a_turn_leaves_after_the_answer_it_continues(ev):
    req = ev["requests"].select("request_id", "received_at", "completed_at")
    cont = (
        ev["sessions"]
        .filter(pl.col("parent_request_id").is_not_null())
        .join(req, on="request_id")
        .join(
            req.select(
                pl.col("request_id").alias("parent_request_id"),
                pl.col("completed_at").alias("parent_done"),
            ),
            on="parent_request_id",
        )
    )
    # Queueing for decode pages is the one delay a client cannot foresee.
    causal = (cont["received_at"] >= cont["parent_done"]).mean()
    assert causal >= 0.98, causal


def test_long_context_sessions_live_in_the_long_range_and_docqa_re_asks(ev):
    req = ev["requests"].select("request_id", "prompt_tokens")
    ses = ev["sessions"].join(req, on="request_id")
    longctx = ses.filter(pl.col("profile") == "longctx")["prompt_tokens"]
    assert longctx.min() >= 250_000 and longctx.quantile(0.5) > 500_000
    # Document QA: a few fixed documents, each question a short variation on one of them.
    for _, g in ses.filter(pl.col("profile") == "docqa").group_by("tenant_id"):
        lengths = np.sort(g["prompt_tokens"].to_numpy())
        clusters = 1 + int((np.diff(lengths) > 2_000).sum())
        assert clusters <= 3
    dq = ses.filter(pl.col("profile") == "docqa")
    assert dq.height >= 5 and dq["prompt_tokens"].n_unique() > 1


def _session_traffic(cfg_overrides: dict, n_cust: int, seed: int = 1):
    """Only the long-context sessions of a default-sized case (no fleet, no files)."""
    from forensics.simulate import sessions, traffic

    cfg = make_config(**cfg_overrides)
    tenants, weights = traffic.make_tenants(cfg, np.random.default_rng(seed))
    budgets = traffic.long_budgets(cfg, tenants, weights, n_cust)
    sender = traffic.Sender(cfg, tenants, np.random.default_rng(seed + 1))
    stats = sessions.session_traffic(cfg, tenants, budgets, sender)
    return tenants, sender.traffic(), stats


@pytest.fixture(scope="module")
def default_sessions():
    # Default knobs, at the scale of a 2M-request case (only the sessions are generated): a
    # conversation crosses the limit only when its document sits just below it, a few times
    # per million requests.
    return _session_traffic({}, n_cust=2_000_000)


def test_default_sessions_cross_the_limit_and_keep_going(default_sessions):
    tenants, tr, stats = default_sessions
    assert stats["longctx"]["tenants"] == 6 and stats["agentic"]["tenants"] == 5
    # One heavy customer of each kind holds most of its profile's sessions.
    by_tenant = pl.DataFrame({"tenant": tr.tenant, "session": tr.session}).unique()
    sessions_of = dict(by_tenant.group_by("tenant").len().iter_rows())
    for profile in ("longctx", "agentic"):
        counts = [sessions_of.get(i, 0) for i, p in enumerate(tenants.profiles) if p == profile]
        assert max(counts) >= 0.4 * sum(counts)
    df = pl.DataFrame(
        {
            "session": tr.session,
            "profile": pl.Series([tenants.profiles[i] for i in tr.tenant]),
            "t": tr.received_us,
            "prompt": tr.prompt,
        }
    ).sort("session", "t")
    crossed = (
        df.group_by("session", maintain_order=True)
        .agg(
            pl.col("profile").first(),
            pl.col("t").filter(pl.col("prompt") < LIMIT).min().alias("below"),
            pl.col("t").filter(pl.col("prompt") >= LIMIT).alias("over"),
        )
        .explode("over")
        .filter(pl.col("over") > pl.col("below"))
        .group_by("session", "profile")
        .len()
    )
    for profile in ("longctx", "agentic"):
        mine = crossed.filter(pl.col("profile") == profile)
        assert mine.height >= 1, profile
    # ... and keep going: sessions send several over-limit turns after crossing.
    assert crossed["len"].max() >= 3
    # Continuation identity over the whole run (the client's view of each answer).
    idx = {(s, t): i for i, (s, t) in enumerate(zip(tr.session, tr.turn, strict=True))}
    for i in np.flatnonzero(tr.parent >= 0).tolist():
        j = idx[(int(tr.session[i]), int(tr.parent[i]))]
        assert tr.prompt[i] == tr.prompt[j] + tr.expect_completion[j] + tr.added[i]


def test_agents_compact_near_the_window_and_grow_again(default_sessions):
    tenants, tr, _ = default_sessions
    agentic = np.array([tenants.profiles[i] == "agentic" for i in tr.tenant])
    restart = agentic & (tr.parent < 0) & (tr.turn > 0)
    assert restart.sum() >= 3
    df = pl.DataFrame(
        {"session": tr.session, "turn": tr.turn, "prompt": tr.prompt, "restart": restart}
    ).filter(pl.Series(agentic))
    df = df.unique(["session", "turn"], keep="last").sort("session", "turn")
    df = df.with_columns(pl.col("prompt").shift(1).over("session").alias("before"))
    drops = df.filter(pl.col("restart"))
    assert (drops["before"] > 0.75 * 1_048_576).all()  # compacted near the window
    # Down to a summary: the agent's base, the summary and one tool output (at most 100,000
    # tokens) against the whole context before it.
    assert (drops["prompt"] < 0.15 * drops["before"]).all()
    assert (drops["prompt"] <= 30_000 + 10_000 + 60_000).all()
    assert tr.prompt[agentic].max() < 1_048_576  # an agent never sends past the window


def _prober(ev, strategy: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    tid = ev["tenants"].filter(pl.col("strategy") == strategy)["tenant_id"].item()
    req = ev["requests"].filter(pl.col("tenant_id") == tid).sort("received_at")
    mine = ev["probes"].filter(pl.col("tenant_id") == tid)
    assert (mine["strategy"] == strategy).all()
    rows = req.join(mine.select("request_id", "phase"), on="request_id").sort("received_at")
    affected = set(ev["affected"]["request_id"])
    rows = rows.with_columns(pl.col("request_id").is_in(list(affected)).alias("leaked"))
    return rows, req


def test_binary_search_brackets_the_limit_with_shrinking_steps(ev):
    rows, _ = _prober(ev, "binary_search")
    probes = rows.filter(pl.col("phase") == "probe")
    lengths = probes["prompt_tokens"].to_numpy()
    assert lengths.min() < LIMIT <= lengths.max()
    steps = np.abs(np.diff(lengths))
    steps = steps[steps > 0]
    assert steps.max() >= 100_000 and steps.min() <= 1_024
    # One request at a time: each probe leaves after the previous answer is back (but for
    # queueing for decode pages, which the prober cannot foresee; the sweep floods them).
    assert (probes["received_at"][1:] >= probes["completed_at"][:-1]).mean() >= 0.85
    # It exploits just above the lowest length that leaked.
    exploits = rows.filter(pl.col("phase") == "exploit")["prompt_tokens"]
    assert exploits.len() >= 10
    assert exploits.min() >= LIMIT and exploits.max() - exploits.min() <= 300
    assert rows.filter(pl.col("phase") == "exploit")["leaked"].any()


def test_sweep_steps_through_the_range_in_quick_succession(ev):
    rows, _ = _prober(ev, "sweep")
    probes = rows.filter(pl.col("phase") == "probe")
    lengths = probes["prompt_tokens"].to_numpy()
    gaps = np.diff(probes["received_at"].dt.epoch("ms").to_numpy()) / 1000
    # The coarse sweep: a fixed step over a wide range, seconds apart, not waiting.
    step = lengths[1] - lengths[0]
    run = 1 + int(np.argmax(np.diff(lengths) != step))
    assert step >= 5_000 and lengths[run - 1] - lengths[0] >= 300_000
    assert (gaps[: run - 1] <= 5).all()
    assert lengths[0] < LIMIT < lengths[run - 1]
    # Then a fine one just below the first length that leaked.
    fine = lengths[run:]
    fine_step = fine[1] - fine[0]
    fine = fine[: 1 + int(np.argmax(np.append(np.diff(fine), 0) != fine_step))]
    assert 0 < fine_step <= 512 and len(fine) >= 5 and fine.max() - fine.min() < step
    first_leak = probes.head(run).filter(pl.col("leaked"))["prompt_tokens"].min()
    assert first_leak - step < fine.min() and fine.max() < first_leak
    assert probes["leaked"].sum() > 0


def test_repeat_sends_one_exact_length_many_times(ev):
    rows, _ = _prober(ev, "repeat")
    exploits = rows.filter(pl.col("phase") == "exploit")
    assert exploits.height >= 100
    assert exploits["prompt_tokens"].n_unique() == 1
    assert exploits["prompt_tokens"][0] >= LIMIT
    span = exploits["received_at"].max() - exploits["received_at"].min()
    assert span.total_seconds() >= 6 * 3600  # harvested over hours and days
    assert rows.filter(pl.col("phase") == "probe").height <= 18  # after a short discovery


def test_slow_prober_hides_a_few_fresh_probes_in_ordinary_traffic(ev):
    rows, everything = _prober(ev, "slow")
    assert 10 <= rows.height <= 20
    assert (rows["phase"] == "probe").all()
    assert rows["prompt_tokens"].n_unique() == rows.height  # every probe a fresh length
    assert ((rows["prompt_tokens"] - LIMIT).abs() < 0.05 * LIMIT).all()
    gaps = np.diff(rows["received_at"].dt.epoch("s").to_numpy())
    assert gaps.min() >= 2 * 3600  # no burst
    ordinary = everything.filter(~pl.col("request_id").is_in(rows["request_id"].to_list()))
    assert ordinary.height >= 5 * rows.height
    assert ordinary["prompt_tokens"].max() < 262_144


def test_prober_counts_in_the_summary_match_the_requests(ev):
    per = ev["summary"]["probers"]
    for strategy in STRATEGIES:
        (entry,) = per[strategy]
        mine = ev["probes"].filter(pl.col("tenant_id") == entry["tenant_id"])
        assert entry["requests"] == mine.height == entry["probes"] + entry["exploits"]
        assert (
            entry["affected"]
            == mine.filter(
                pl.col("request_id").is_in(ev["affected"]["request_id"].to_list())
            ).height
        )


def test_probers_are_deterministic_and_leave_sessions_unchanged(tmp_path):
    def digest(folder: Path, name: str) -> str:
        return hashlib.sha256((folder / name).read_bytes()).hexdigest()

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    simulate_case(a, requests=2000, seed=9, probers=("sweep", "slow"))
    simulate_case(b, requests=2000, seed=9, probers=("sweep", "slow"))
    simulate_case(c, requests=2000, seed=9)
    for name in ("truth/probes.csv", "truth/tenants.csv", "evidence/engine_legs-decode.parquet"):
        assert digest(a, name) == digest(b, name)
    # Probers draw from their own stream: the long-context sessions are the same without them.
    cols = ["tenant_id", "profile", "session", "turn", "attempt", "added_tokens"]
    assert (
        pl.read_csv(a / "truth/sessions.csv")
        .select(cols)
        .equals(pl.read_csv(c / "truth/sessions.csv").select(cols))
    )
    ten_a = pl.read_csv(a / "truth/tenants.csv").select("tenant_id", "profile")
    assert ten_a.equals(pl.read_csv(c / "truth/tenants.csv").select("tenant_id", "profile"))


def test_bad_prober_names_fail_with_the_exact_message(tmp_path):
    from forensics.cli import app

    with pytest.raises(ForensicsError) as err:
        simulate_case(tmp_path / "x", requests=500, probers=("sweep", "bisect"))
    assert str(err.value) == f"simulate: {BAD_NAME}"
    assert not (tmp_path / "x").exists()
    runner = CliRunner(env={"COLUMNS": "200"})
    res = runner.invoke(app, ["simulate", str(tmp_path / "y"), "--probers", "sweep,bisect"])
    assert res.exit_code == 2
    assert f"Invalid value for '--probers': {BAD_NAME}" in res.output
    assert not (tmp_path / "y").exists()
    res = runner.invoke(
        app, ["simulate", str(tmp_path / "z"), "-n", "1000", "--probers", "repeat,slow"]
    )
    assert res.exit_code == 0, res.output
    assert "Probers: repeat" in res.output and "slow" in res.output
    truth = pl.read_csv(tmp_path / "z" / "truth" / "tenants.csv")
    assert sorted(truth.filter(pl.col("deliberate"))["strategy"]) == [
        "repeat",
        "researcher",
        "slow",
    ]


def test_session_data_ships_inside_the_package():
    from importlib.resources import files

    from forensics.simulate import sessions

    data = files("forensics.simulate").joinpath("data")
    for name in ("mooncake_sessions.csv.gz", "LICENSE-APACHE", "README.md"):
        assert data.joinpath(name).is_file(), name
    cols, bounds = sessions.load_trace()
    assert len(cols["session"]) == 12_031 and len(bounds) - 1 == 8_056
    assert min(cols["added_tokens"]) >= 1
    assert all(p < t for p, t in zip(cols["parent"], cols["turn"], strict=True))


def test_code_requests_arrive_in_bursts_and_chat_requests_do_not(ev):
    # The coding service's trace: 17 % of its gaps under a millisecond, bursts of up to 188
    # requests; the conversation service's arrives much as a Poisson process. At this case's
    # rate a tenant's independent requests are hours apart, so sub-millisecond gaps between
    # one tenant's requests come only from a burst.
    profile = dict(ev["tenants"].select("tenant_id", "profile").iter_rows())
    req = (
        ev["requests"]
        .select("tenant_id", "received_at")
        .with_columns(pl.col("tenant_id").replace_strict(profile, default=None).alias("profile"))
    )
    gaps = (
        req.sort("tenant_id", "received_at")
        .with_columns(gap=pl.col("received_at").diff().over("tenant_id").dt.total_microseconds())
        .drop_nulls("gap")
    )
    sub_ms = dict(
        gaps.group_by("profile").agg((pl.col("gap") < 1_000).mean().alias("share")).iter_rows()
    )
    assert 0.08 <= sub_ms["code"] <= 0.35
    assert sub_ms["chat"] < 0.01 and sub_ms["rag"] < 0.01


def test_bursts_match_the_coding_trace():
    from forensics.simulate.traffic import BURST_GAP_MAX_US, bursts

    cfg = make_config()
    rng = np.random.default_rng(7)
    at, who = bursts(cfg, 200_000, np.array([0.0, 0.6, 0.4]), rng)
    assert len(at) == len(who) == 200_000
    assert set(np.unique(who)) == {1, 2}  # a tenant of no weight sends nothing
    assert abs((who == 1).mean() - 0.6) < 0.03
    assert ((at >= cfg.us(cfg.start)) & (at < cfg.us(cfg.end))).all()
    # Burst by burst: within one, one tenant and gaps of at most 100 ms.
    step = np.diff(at)
    inside = (step >= 0) & (step <= BURST_GAP_MAX_US) & (who[1:] == who[:-1])
    gaps = np.diff(np.sort(at))
    assert 0.14 <= (gaps < 1_000).mean() <= 0.21  # the trace: 0.17
    assert inside.mean() > 0.6  # the trace: 2,687 bursts for 8,819 requests, 70 % inside one
