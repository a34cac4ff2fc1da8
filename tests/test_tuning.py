"""Every tunable is declared once (forensics.parameters), the manifest's [detection] may set
it, detection uses what it sets, and the report shows each with its default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forensics.case import load_case
from forensics.detect import case_parameters
from forensics.detectors import load_detectors
from forensics.errors import ManifestError
from forensics.exploitation import TenantEvidence, Tuning, judge
from forensics.parameters import DERIVED, PARAMETERS, tunable_parameters

MINIMAL = """\
[incident]
id = "INC-1"
timezone = "UTC"
context_length = 1048576
"""


def manifest(tmp_path: Path, detection: str = "") -> Path:
    path = tmp_path / "case.toml"
    path.write_text(MINIMAL + (f"[detection]\n{detection}" if detection else ""))
    return path


def test_every_detector_parameter_is_tunable_except_the_derived_ones():
    tunables = tunable_parameters()
    for det in load_detectors():
        for name in det.parameters:
            assert (name in tunables) != (name in DERIVED), name
    assert set(PARAMETERS) <= set(tunables)


def test_defaults_come_from_the_detector_metadata_when_the_manifest_is_silent(tmp_path):
    params = case_parameters(load_case(manifest(tmp_path)))
    for det in load_detectors():
        for name, value in det.defaults().items():
            if name not in DERIVED:
                assert params[name] == value, name
    assert params["exploitation_high_points"] == PARAMETERS["exploitation_high_points"].default


def test_the_manifest_sets_detector_and_case_level_tunables(tmp_path):
    case = load_case(
        manifest(
            tmp_path,
            "latency_factor = 0.1\nmin_bin_requests = 9\nexploitation_high_points = 3\n"
            "coverage_gap_s = 600\n",
        )
    )
    params = case_parameters(case)
    assert params["latency_factor"] == 0.1
    assert params["min_bin_requests"] == 9
    assert params["exploitation_high_points"] == 3.0
    assert params["coverage_gap_s"] == 600.0


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "exploitaton_high_points = 2\n",
            "case.toml: [detection].exploitaton_high_points: unknown key (expected one of: ",
        ),
        (
            "context_length = 5\n",
            "case.toml: [detection].context_length: unknown key",
        ),
        (
            "continue_tokens = 1.5\n",
            "case.toml: [detection].continue_tokens: must be a whole number, got 1.5",
        ),
        (
            "exploitation_high_points = 0.5\n",
            "case.toml: [detection].exploitation_high_points: must be above 1, got 0.5",
        ),
        (
            "exploitation_focus_p = 2\n",
            "case.toml: [detection].exploitation_focus_p: must be a number between 0 and 1,"
            " got 2.0",
        ),
        (
            'min_bin_requests = "five"\n',
            "case.toml: [detection].min_bin_requests: must be a number, got 'five'",
        ),
        ("max_held_ratio = true\n", "case.toml: [detection].max_held_ratio: must be a number"),
    ],
)
def test_bad_tunables_are_refused_naming_the_key(tmp_path, line, message):
    with pytest.raises(ManifestError) as err:
        load_case(manifest(tmp_path, line))
    assert str(err.value).startswith(message)


def test_a_tuned_threshold_changes_the_rating():
    """A bisection worth one point is medium by default; raising what medium needs lowers it."""
    steps = [600_000, 700_000, 650_000, 675_000, 662_500, 668_750, 665_625]
    ev = TenantEvidence(
        "t",
        np.array(steps),
        np.full(len(steps), 681_274),
        (np.array(steps) - 681_274) / 681_274,
        np.zeros(len(steps), dtype=bool),
        over=0,
    )
    default = judge(ev)
    assert "bisection" in default.indications
    strict = judge(
        TenantEvidence(
            ev.tenant_id,
            ev.prompts,
            ev.limits,
            ev.offsets,
            ev.continued,
            tuning=Tuning.from_params({"exploitation_high_points": 100.0}),
        )
    )
    assert strict.indications == default.indications
    points = sum(default.indications.values())
    assert default.level == ("high" if points >= 1.5 else "medium")
    assert strict.level == "medium"


def test_tuning_from_params_keeps_defaults_for_what_is_not_set():
    assert Tuning.from_params({}) == Tuning()
    assert Tuning.from_params({"exploitation_question_tokens": 50}).question == 50
