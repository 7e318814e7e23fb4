"""The golden JSON outputs (tests/golden/outputs/, written by tests/golden/make_golden.py) are what the
command line gives now, and the comparison that says so reports every difference it must.

The reproduction runs the script's --check in a child process (about 10 s: every command in one
process, tiny sizes). The comparison's own tests compare a temporary copy of the stored outputs,
edited, with the stored outputs (`--fresh`), so they hold on any machine.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from golden import make_golden as golden

LIVE = "analyze-live-linear-td"
VALUE = ("activations", "layers", 0, "value_error")
"""A float that the analysis computes from the model's forward pass."""


@pytest.fixture(scope="module")
def stored():
    outputs, machine = golden.load(golden.OUTPUTS)
    assert outputs and machine, "tests/golden/outputs/ is empty: run tests/golden/make_golden.py"
    return outputs, machine


def _get(value, path):
    for key in path:
        value = value[key]
    return value


def _set(value, path, new):
    _get(value, path[:-1])[path[-1]] = new


def _check(tmp_path, capsys, edit, *flags: str) -> tuple[int, list[str]]:
    """`make_golden.py --check` of a copy of the stored outputs, changed by `edit(outputs)`, against the
    stored outputs: its exit status and its lines of differences."""
    outputs, machine = golden.load(golden.OUTPUTS)
    edit(outputs)
    golden.write(outputs, machine, tmp_path / "copy")
    code = golden.main(["--check", "--stored", str(tmp_path / "copy"), "--fresh", str(golden.OUTPUTS), *flags])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"{len(golden.load(golden.OUTPUTS)[0])} outputs, ")
    return code, lines[:-1]


def test_the_stored_outputs_are_reproduced(stored):
    run = subprocess.run([sys.executable, str(golden.__file__), "--check"], capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert f"{len(stored[0])} outputs, 0 differences" in run.stdout.splitlines()[-1]


def test_the_stored_outputs_are_the_cases(stored, tmp_path):
    names = {name for name, _ in golden.cases(tmp_path) if name}
    assert set(stored[0]) == names
    for fam in golden.FAMILIES:  # what the issue asks to freeze
        assert {f"analyze-checkpoint-{fam}", f"analyze-recording-{fam}", f"analyze-live-{fam}",
                f"format_v1-analyze-checkpoint-{fam}", f"format_v1-analyze-recording-{fam}"} <= names
    assert {"user-torch-analyze-live", "user-tl-analyze-recording", "verdict-checkpoint-linear-td",
            "causal-linear-td", "inspect-linear-td"} <= names


def test_the_stored_outputs_hold_no_path_or_version_of_one_run(stored):
    text = json.dumps(stored[0])
    assert str(golden.REPO) not in text and "icrl-golden-" not in text
    assert '"<repo>/data/checkpoints/linear-td"' in text and '"<work>/linear-td.h5"' in text
    assert all(f'"{key}"' not in text for key in golden.VARYING_KEYS)
    assert stored[0][LIVE]["kind"] == "live" and stored[0]["verdict-checkpoint-linear-td"]["schema"].startswith(
        "icrl_interp.verdict")


def test_normalize_replaces_paths_and_drops_what_varies(tmp_path):
    raw = {"a": [{"versions": {"numpy": "9"}, "p": f"{tmp_path}/x.h5 from {golden.REPO}/data"}], "versions": 1}
    assert golden.normalize(raw, tmp_path) == {"a": [{"p": "<work>/x.h5 from <repo>/data"}]}


def test_a_float_moved_beyond_the_tolerance_is_reported(stored, tmp_path, capsys):
    x = _get(stored[0][LIVE], VALUE)
    tol = golden.REL_TOL * abs(x) + golden.ABS_EPS * sys.float_info.epsilon * golden.scale_of(stored[0][LIVE])
    code, lines = _check(tmp_path, capsys, lambda o: _set(o[LIVE], VALUE, x + 2 * tol))
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith(f"{LIVE}:/activations/layers/0/value_error: {x + 2 * tol!r} -> {x!r}")


def test_a_float_moved_within_the_tolerance_passes_but_not_bit_for_bit(stored, tmp_path, capsys):
    x = _get(stored[0][LIVE], VALUE)
    tol = golden.REL_TOL * abs(x) + golden.ABS_EPS * sys.float_info.epsilon * golden.scale_of(stored[0][LIVE])
    assert x + tol / 2 != x
    assert _check(tmp_path, capsys, lambda o: _set(o[LIVE], VALUE, x + tol / 2)) == (0, [])
    code, lines = _check(tmp_path, capsys, lambda o: _set(o[LIVE], VALUE, x + tol / 2), "--exact")
    assert code == 1 and [line.split(": ")[0] for line in lines] == [f"{LIVE}:/activations/layers/0/value_error"]


def test_missing_and_extra_keys_and_outputs_are_reported(stored, tmp_path, capsys):
    layers = len(stored[0]["analyze-recording-sarsa"]["activations"]["layers"])
    rms = stored[0][LIVE]["activations"]["layers"][1]["value_rms"]

    def edit(o):  # the copy is what is stored, the real outputs what the code writes
        del o[LIVE]["activations"]["layers"][1]["value_rms"]
        o["causal-linear-td"]["new_key"] = 1
        o["analyze-recording-sarsa"]["activations"]["layers"].pop()
        del o["inspect-linear-td"]
        o["not-a-case"] = {}

    code, lines = _check(tmp_path, capsys, edit)
    assert code == 1 and sorted(lines) == sorted([
        f"{LIVE}:/activations/layers/1/value_rms: extra key, {rms!r}",
        "causal-linear-td:/new_key: missing",
        f"analyze-recording-sarsa:/activations/layers: length {layers - 1} -> {layers}",
        "inspect-linear-td: a new output, not stored",
        "not-a-case: missing from the new outputs",
    ])


def test_strings_compare_their_text_exactly_and_their_numbers_as_floats():
    s = "td0 (margin over td_lambda_0.5: 0.25, interval [-0.016393898048086115, 1.1496977969200257] includes 0)"
    nudged = s.replace("1.1496977969200257", repr(1.1496977969200257 * (1 + 1e-12)))
    assert golden.compare({"t": s}, {"t": nudged}) == []
    assert golden.compare({"t": s}, {"t": nudged}, "exact") == [f"/t: {s!r} -> {nudged!r}"]
    assert golden.compare({"t": s}, {"t": s.replace("0.25", "0.26")}) != []
    assert golden.compare({"t": s}, {"t": s.replace("td0 (", "td1 (")}) != []
    assert golden.compare({"t": s}, {"t": s.replace("includes", "excludes")}) != []


def test_exact_mode_tells_minus_zero_and_nan():
    assert golden.compare([0.0], [-0.0], "exact") != [] and golden.compare([0.0], [-0.0]) == []
    assert golden.compare([math.nan], [math.nan], "exact") == []
    assert golden.compare([math.nan], [1.0]) != [] and golden.compare([math.inf], [-math.inf]) != []
    assert golden.compare([1], [1.0]) == ["/0: type int -> float (1 -> 1.0)"]  # a count became a float


def test_the_scale_of_the_absolute_tolerance_is_the_outputs_largest_float():
    out = {"big": 1000.0, "zero_in_exact_arithmetic": 1e-20, "n": 10**6}
    moved = {**out, "zero_in_exact_arithmetic": 5e-12}  # 5e-12 < 64 eps * 1000 = 1.4e-11
    assert golden.scale_of(out) == 1000.0 and golden.compare(out, moved) == []
    assert golden.compare({**out, "big": 1.0}, {**moved, "big": 1.0}) != []  # at scale 1 it is a difference


def test_on_other_float_kernels_only_the_structure_is_compared(stored):
    here = stored[1]
    assert golden.mode_for(False, here, dict(here)) == ("values", [])
    assert golden.mode_for(True, here, dict(here)) == ("exact", [])
    other = {**here, "torch_cpu_capability": "DEFAULT"}
    assert golden.mode_for(False, here, other) == ("structure", ["torch_cpu_capability"])
    assert golden.mode_for(False, None, here)[0] == "structure"
    a = {"x": [1.0, "input", 3, True], "y": None}
    assert golden.compare(a, {"x": [2.0, "shuffled", 4, False], "y": None}, "structure") == []
    assert golden.compare(a, {"x": [2.0, "shuffled", 4], "y": None}, "structure") == ["/x: length 4 -> 3"]
    assert golden.compare(a, {"x": [None, "input", 3, True], "y": None}, "structure")[0].startswith(
        "/x/0: type float -> NoneType")
    assert golden.compare(a, {"x": a["x"]}, "structure") == ["/y: missing"]
