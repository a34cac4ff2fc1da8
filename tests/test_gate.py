"""``forensics gate``: every check with a true positive and a true negative, on saved
server_info documents and on a live local engine; every bad input with its exact outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.engine_server import Engine, refused_url
from typer.testing import CliRunner

from forensics.cli import app
from forensics.errors import ForensicsError
from forensics.gate import judge, load_known_bad, version_key

runner = CliRunner(env={"COLUMNS": "250"})
DOCS = Path(__file__).parent / "fixtures" / "server_info"


def doc(name: str) -> dict:
    return json.loads((DOCS / name).read_text())


def run(*args: str):
    return runner.invoke(app, ["gate", *args])


def checks(report, source: str) -> dict[str, tuple[bool, str]]:
    node = next(n for n in report.nodes if n.source == source)
    return {c.name: (c.passed, c.why) for c in node.checks}


def fleet(*names: str, **options):
    return judge([(n, doc(n)) for n in names], **options)


# --- the whole command ----------------------------------------------------------------------


def test_healthy_fleet_passes():
    result = run(str(DOCS / "prefill-good.json"), str(DOCS / "decode-good.json"))
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output
    assert "Gate: pass: all 2 nodes passed (each engine's own context length)." in result.output


def test_incident_prefill_fails_with_why():
    result = run(
        str(DOCS / "prefill-incident.json"),
        str(DOCS / "prefill-good.json"),
        str(DOCS / "decode-good.json"),
        "--context-length",
        "1048576",
    )
    assert result.exit_code == 1, result.output
    out = result.output
    assert (
        "max_req_input_len 681,274 is below 1,048,570, the normal ceiling for context 1,048,576: "
        "the KV pool of 681,280 tokens is smaller than the context and pulls it down; prompts of "
        "681,274 to 1,048,575 tokens reach the rejection path"
    ) in out
    assert "sglang 0.5.19 is in the known-bad range < 0.5.22 (pd-rejected-prompt-admitted)" in out
    assert "Gate: FAIL: 1 of 3 nodes failed (advertised context 1,048,576): " in out
    assert out.strip().endswith("prefill-incident.json")


def test_mixed_fleet_names_each_failing_node_and_why():
    names = [
        "prefill-good.json",
        "decode-good.json",
        "prefill-drift.json",
        "unified.json",
        "decode-small.json",
        "prefill-pool-only.json",
    ]
    result = run(*(str(DOCS / n) for n in names), "--context-length", "1048576", "--json")
    assert result.exit_code == 1
    failed = {
        Path(node["source"]).name: sorted(c["check"] for c in node["checks"] if not c["passed"])
        for node in json.loads(result.output)["nodes"]
    }
    assert failed == {
        "prefill-good.json": [],
        "decode-good.json": [],
        "prefill-drift.json": ["chunked_prefill", "page_size"],
        "unified.json": ["roles"],
        "decode-small.json": ["decode_pool"],
        "prefill-pool-only.json": ["limit"],
    }


def test_json_for_pipelines():
    result = run(str(DOCS / "prefill-incident.json"), str(DOCS / "decode-good.json"), "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["passed"] is False and data["context_length"] is None
    assert data["known_bad_list"]["updated"]
    bad, good = data["nodes"]
    assert set(bad) == {
        "source",
        "passed",
        "error",
        "role",
        "version",
        "context_length",
        "max_total_num_tokens",
        "max_req_input_len",
        "page_size",
        "chunked_prefill_size",
        "limit",
        "ceiling",
        "checks",
    }
    assert (bad["passed"], bad["limit"], bad["ceiling"], bad["role"]) == (
        False,
        681274,
        1048570,
        "prefill",
    )
    failed = {c["check"] for c in bad["checks"] if not c["passed"]}
    assert failed == {"limit", "version"}
    assert good["passed"] is True and good["role"] == "decode" and good["error"] is None


def test_context_from_a_case_manifest(tmp_path):
    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "X"\ncontext_length = 131072\n')
    # The incident's prefill holds the smaller advertised context: its limit passes.
    result = run(str(DOCS / "prefill-incident.json"), "--case", str(manifest), "--json")
    data = json.loads(result.output)
    assert data["context_length"] == 131072
    limit = next(c for c in data["nodes"][0]["checks"] if c["check"] == "limit")
    assert limit["passed"] is True
    assert "reaches 131,066" in limit["why"]


# --- limit (prefill and unified) ------------------------------------------------------------


def test_limit_true_negative_and_smaller_advertised_context():
    report = fleet("prefill-good.json")
    assert checks(report, "prefill-good.json")["limit"] == (
        True,
        "max_req_input_len 1,048,570 reaches 1,048,570, the normal ceiling for context 1,048,576",
    )
    report = fleet("prefill-good.json", context_length=262144)
    assert checks(report, "prefill-good.json")["limit"][0] is True


def test_limit_implied_by_the_pool_when_not_reported():
    report = fleet("prefill-pool-only.json")
    ok, why = checks(report, "prefill-pool-only.json")["limit"]
    assert not ok
    assert why.startswith(
        "the limit implied by the pool (681,280 tokens, page 64) 681,274 is below"
    )
    big = doc("prefill-pool-only.json") | {"max_total_num_tokens": 2039808}
    report = judge([("big", big)])
    assert checks(report, "big")["limit"][0] is True


def test_limit_reported_but_the_pool_binds():
    info = doc("prefill-incident.json") | {"max_req_input_len": 1048570, "version": "0.5.22"}
    ok, why = checks(judge([("n", info)]), "n")["limit"]
    assert not ok
    assert why.startswith("the limit implied by the pool (681,280 tokens, page 64) 681,274 is")


def test_limit_counts_whole_pages_only():
    # A pool one token short of 16,385 pages counts as 16,384 whole pages (1,048,576 tokens):
    # the ceiling is still reached. One token short of 16,384 pages counts as 16,383: it is not.
    info = doc("prefill-pool-only.json") | {"max_total_num_tokens": 1048576 + 64 - 1}
    assert "max_req_input_len" not in info
    assert checks(judge([("n", info)]), "n")["limit"][0] is True
    info["max_total_num_tokens"] = 1048576 - 1
    ok, why = checks(judge([("n", info)]), "n")["limit"]
    assert not ok and "page 64) 1,048,506 is below" in why


def test_limit_when_the_engine_context_is_below_the_advertised_one():
    info = doc("prefill-good.json") | {"context_length": 131072, "max_req_input_len": 131066}
    ok, why = checks(judge([("n", info)], context_length=1048576), "n")["limit"]
    assert not ok
    assert "the engine's own context_length 131,072 is below it" in why


def test_limit_without_any_context_or_pool():
    info = doc("prefill-good.json")
    del info["context_length"]
    ok, why = checks(judge([("n", info)]), "n")["limit"]
    assert not ok and why.endswith("pass --context-length")
    assert checks(judge([("n", info)], context_length=1048576), "n")["limit"][0] is True
    del info["max_req_input_len"], info["max_total_num_tokens"]
    ok, why = checks(judge([("n", info)], context_length=1048576), "n")["limit"]
    assert (ok, why) == (False, "reports neither max_req_input_len nor max_total_num_tokens")


def test_unified_node_gets_the_limit_check():
    info = doc("unified.json") | {"max_total_num_tokens": 681280, "max_req_input_len": 681274}
    assert checks(judge([("u", info)]), "u")["limit"][0] is False


# --- decode pool ----------------------------------------------------------------------------


def test_decode_pool_true_positive_and_negative():
    report = fleet("decode-good.json", "decode-small.json")
    assert checks(report, "decode-good.json")["decode_pool"] == (
        True,
        "the pool of 4,194,304 tokens holds a 1,048,570-token prompt "
        "(16,384 pages of 64 needed, 65,536 in the pool)",
    )
    ok, why = checks(report, "decode-small.json")["decode_pool"]
    assert not ok
    assert why.endswith(
        "(16,384 pages of 64 needed, 8,192 in the pool): decode refuses prompts the context allows"
    )
    assert "limit" not in checks(report, "decode-good.json")


def test_decode_pool_unknown_fails_closed():
    info = doc("decode-good.json")
    del info["max_total_num_tokens"]
    assert checks(judge([("d", info)]), "d")["decode_pool"] == (
        False,
        "reports no max_total_num_tokens (its KV pool)",
    )
    del info["context_length"]
    ok, why = checks(judge([("d", info)]), "d")["decode_pool"]
    assert not ok and why.endswith("pass --context-length")


# --- the fleet agrees -----------------------------------------------------------------------


def test_page_size_and_chunked_prefill_drift():
    report = fleet("prefill-good.json", "prefill-drift.json", "decode-good.json")
    drift = checks(report, "prefill-drift.json")
    assert drift["page_size"] == (False, "page_size 1, where 2 of 3 nodes use 64")
    good = checks(report, "prefill-good.json")
    assert good["page_size"] == (True, "page_size 64, as on 2 of 3 nodes")
    # Two nodes prefill and disagree: no majority, both fail; decode is not asked.
    assert drift["chunked_prefill"] == (
        False,
        "chunked_prefill 8,192: the fleet disagrees with no majority: "
        "131,072 on prefill-good.json; 8,192 on prefill-drift.json",
    )
    assert good["chunked_prefill"][0] is False
    assert "chunked_prefill" not in checks(report, "decode-good.json")


def test_agreement_true_negative():
    report = fleet("prefill-good.json", "decode-good.json")
    for source in ("prefill-good.json", "decode-good.json"):
        for name in ("roles", "page_size", "context_length"):
            assert checks(report, source)[name] == (
                True,
                checks(report, source)[name][1],
            )
            assert "on all 2 nodes that report it" in checks(report, source)[name][1]
    assert checks(report, "prefill-good.json")["chunked_prefill"] == (
        True,
        "chunked_prefill 131,072 on the only node that reports it",
    )


def test_unified_node_in_a_pd_fleet_fails_roles():
    report = fleet("prefill-good.json", "decode-good.json", "unified.json")
    assert checks(report, "unified.json")["roles"] == (
        False,
        "roles unified, where 2 of 3 nodes use PD",
    )
    assert checks(report, "decode-good.json")["roles"][0] is True


def test_context_lengths_disagree():
    other = doc("decode-good.json") | {"context_length": 131072}
    report = judge(
        [("p", doc("prefill-good.json")), ("d1", doc("decode-good.json")), ("d2", other)]
    )
    assert checks(report, "d2")["context_length"] == (
        False,
        "context_length 131,072, where 2 of 3 nodes use 1,048,576",
    )


# --- version --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,bad",
    [
        ("0.5.11", True),
        ("0.5.19", True),
        ("0.5.21.post2", True),
        ("0.5.22rc1", True),
        ("0.5.22.dev3", True),
        ("v0.4.6.post5", True),
        ("0.5.22", False),
        ("0.5.22.post1", False),
        ("0.6.0", False),
        ("1.0", False),
    ],
)
def test_version_against_the_known_bad_list(version, bad):
    info = doc("prefill-good.json") | {"version": version}
    ok, why = checks(judge([("n", info)]), "n")["version"]
    assert ok is not bad, why
    if bad:
        assert why.endswith("it admits prompts it rejected; run 0.5.22 or later")


def test_version_range_limited_to_pd_roles():
    # The hole is in the PD admission queues: an affected release serving without
    # disaggregation is not in the range; as a decode node it is.
    unified = doc("unified.json") | {"version": "0.5.19"}
    ok, why = checks(judge([("u", unified)]), "u")["version"]
    assert (
        ok
        and why
        == "sglang 0.5.19 is in no known-bad range for a unified node (list updated 2026-09-15)"
    )
    decode = doc("decode-good.json") | {"version": "0.5.19"}
    assert checks(judge([("d", decode)]), "d")["version"][0] is False


def test_version_missing_or_unparseable_fails_closed():
    info = doc("prefill-good.json")
    del info["version"]
    assert checks(judge([("n", info)]), "n")["version"] == (
        False,
        "reports no engine version: it cannot be checked against the known-bad list",
    )
    info["version"] = "main-abcdef"
    ok, why = checks(judge([("n", info)]), "n")["version"]
    assert not ok and "'main-abcdef' is no release number" in why


def test_version_order():
    order = ["0.5.21", "0.5.21.post2", "0.5.22.dev0", "0.5.22a1", "0.5.22rc1", "0.5.22"]
    order += ["0.5.22.post1", "0.5.23", "0.6"]
    keys = [version_key(v) for v in order]
    assert keys == sorted(keys)
    assert version_key("0.5") == version_key("0.5.0")
    with pytest.raises(ValueError):
        version_key("latest")


def test_known_bad_list_is_data(tmp_path):
    listed = load_known_bad()
    assert listed.ranges and all(r.references for r in listed.ranges)
    custom = tmp_path / "bad.toml"
    custom.write_text(
        'updated = "2026-10-01"\n[[range]]\nengine = "sglang"\nid = "x"\n'
        'introduced = "0.5.22"\nsummary = "s"\n'
    )
    known = load_known_bad(custom)
    assert known.match("sglang", "0.5.30").describe() == ">= 0.5.22, every release so far"
    assert known.match("sglang", "0.5.21") is None
    ok, why = checks(judge([("n", doc("prefill-good.json"))], known_bad=known), "n")["version"]
    assert not ok and why.endswith("no fixed release yet")


@pytest.mark.parametrize(
    "text,message",
    [
        ("[[range]]\nengine = 'sglang'\n", "[[range]] 1: `id` must be a non-empty string"),
        (
            "[[range]]\nengine='e'\nid='i'\nintroduced='soon'\nsummary='s'\n",
            "[[range]] 1: `introduced` 'soon' is no release",
        ),
        (
            "[[range]]\nengine='e'\nid='i'\nintroduced='0'\nsummary='s'\nfixed=1\n",
            "`fixed` must be a string",
        ),
        (
            "[[range]]\nengine='e'\nid='i'\nintroduced='0'\nsummary='s'\nreferences='x'\n",
            "`references` must be a list of strings",
        ),
        ("range = [", "not valid TOML"),
        (
            "[[range]]\nengine='e'\nid='i'\nintroduced='0'\nsummary='s'\nroles=['gpu']\n",
            "`roles` must be a list of decode, prefill, unified",
        ),
    ],
)
def test_known_bad_list_errors_name_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ForensicsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_known_bad(path)
    with pytest.raises(ForensicsError, match="cannot read the known-bad list"):
        load_known_bad(tmp_path / "missing.toml")


# --- documents that cannot be judged --------------------------------------------------------


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"max_req_input_len": "681274"}, "max_req_input_len is not an integer: '681274'"),
        ({"page_size": 0}, "page_size is out of range: 0"),
        ({"context_length": True}, "context_length is not an integer: True"),
        ({"disaggregation_mode": "both"}, "disaggregation_mode is not prefill, decode or null"),
        ({"version": 5}, "version is not a string: 5"),
    ],
)
def test_unusable_document_fails_the_node(change, reason):
    report = judge([("n", doc("prefill-good.json") | change)])
    assert not report.passed
    ok, why = checks(report, "n")["read"]
    assert not ok and why.startswith("server_info is not usable: ") and reason in why


def test_values_found_under_internal_states_and_chunked_prefill_off():
    info = doc("prefill-good.json") | {"chunked_prefill_size": -1}
    info["internal_states"] = [{"max_req_input_len": info.pop("max_req_input_len")}]
    report = judge([("n", info)])
    assert report.passed
    assert report.nodes[0].max_req_input_len == 1048570


@pytest.mark.parametrize(
    "content,reason",
    [
        ("<html>down</html>", "not JSON ('<html>down</html>')"),
        ("[1, 2]", "not a JSON object ('[1, 2]')"),
        ("", "not JSON (empty body)"),
    ],
)
def test_saved_file_that_is_no_document(tmp_path, content, reason):
    path = tmp_path / "n.json"
    path.write_text(content)
    result = run(str(path))
    assert result.exit_code == 1
    assert f"{path}: {reason}" in result.output
    assert "Traceback" not in result.output


# --- live engines ---------------------------------------------------------------------------


def test_live_engine_with_the_incident_fails():
    with Engine(limit=2000, context=4096, version="0.5.19") as engine:
        result = run(engine.url, "--json")
    assert result.exit_code == 1
    node = json.loads(result.output)["nodes"][0]
    assert node["source"] == engine.url and node["role"] == "prefill"
    failed = {c["check"]: c["why"] for c in node["checks"] if not c["passed"]}
    assert set(failed) == {"limit", "version"}
    assert "max_req_input_len 2,000 is below 4,090" in failed["limit"]


def test_live_engine_fixed_passes():
    with Engine(limit=4090, context=4096) as engine:
        result = run(engine.url + "/", "--context-length", "4096")
    assert result.exit_code == 0, result.output
    assert "Gate: pass: all 1 node passed (advertised context 4,096)." in result.output


@pytest.mark.parametrize(
    "fail,reason",
    [
        ("500", "/get_server_info: HTTP 500 Internal Server Error"),
        ("not_json", "/get_server_info: not JSON ('<html><body>maintenance</body></html>')"),
        ("hang", "/get_server_info: timed out after 0.3 s"),
        ("huge", "/get_server_info: answer larger than 16 MiB"),
        ("cut", "/get_server_info: the answer was cut off (10 of 1,000 bytes)"),
        ("close", "/get_server_info: the connection closed without an answer"),
    ],
)
def test_unreadable_endpoint_is_a_failing_node(fail, reason):
    with Engine(fail=fail, hang_s=2.0) as bad, Engine(limit=4090, context=4096) as good:
        result = run(bad.url, good.url, "--timeout", "0.3")
    assert result.exit_code == 1
    assert f"{bad.url}{reason}" in result.output
    assert f"Gate: FAIL: 1 of 2 nodes failed (each engine's own context length): {bad.url}" in (
        result.output
    )
    assert "Traceback" not in result.output


def test_connection_refused_names_the_endpoint():
    url = refused_url()
    result = run(url, "--json")
    assert result.exit_code == 1
    node = json.loads(result.output)["nodes"][0]
    assert node["error"] == f"{url}/get_server_info: connection refused"
    assert node["checks"] == [
        {"check": "read", "passed": False, "why": f"{url}/get_server_info: connection refused"}
    ]


# --- usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "Missing argument 'SOURCE'"),
        (["no-such-file.json"], "no-such-file.json is neither an engine base URL"),
        (["http://"], "not an engine base URL such as http://host:30000"),
        (["http://h:99999"], "not a valid port"),
        ([str(DOCS / "prefill-good.json"), "--context-length", "0"], "--context-length"),
        ([str(DOCS / "prefill-good.json"), "--timeout", "0"], "--timeout"),
        (
            [str(DOCS / "prefill-good.json"), "--context-length", "5", "--case", "x.toml"],
            "give --context-length or --case, not both",
        ),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_case_without_context_is_a_usage_error(tmp_path):
    manifest = tmp_path / "case.toml"
    manifest.write_text('[incident]\nid = "X"\n')
    result = run(str(DOCS / "prefill-good.json"), "--case", str(manifest))
    assert result.exit_code == 2
    assert "sets no [incident].context_length" in result.output


def test_malformed_case_manifest_is_one_line(tmp_path):
    manifest = tmp_path / "case.toml"
    manifest.write_text("[incident\n")
    result = run(str(DOCS / "prefill-good.json"), "--case", str(manifest))
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_help_lists_both_commands_and_stays_light():
    import subprocess
    import sys

    result = runner.invoke(app, ["--help"])
    assert "gate" in result.output and "canary" in result.output
    # Registering the commands imports neither the HTTP client nor the checks themselves.
    code = (
        "import sys, forensics.cli; "
        "print(sorted(m for m in ('urllib.request', 'forensics.gate', 'forensics.canary') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hostile_values_are_shown_never_obeyed(tmp_path):
    path = tmp_path / "n.json"
    info = doc("prefill-good.json") | {"version": "0.5.22\x1b[2J[red]x"}
    path.write_text(json.dumps(info))
    result = run(str(path))
    assert result.exit_code == 1
    assert "\x1b" not in result.output
    assert "engine version '0.5.22\\x1b[2J[red]x' is no release number" in result.output
