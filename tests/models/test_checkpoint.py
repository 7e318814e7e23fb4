"""The checkpoint format: exact round trips, the reader stays torch-free, and every kind of
bad file is refused with a one-line UserError naming the problem (pickles never executed)."""
from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from icrl_interp.families import registry
from icrl_interp.models import checkpoint
from icrl_interp.core.errors import UserError
from icrl_interp.models import ModelConfig, build_model, theta_star_model

from helpers import raises_user

MODELS = {
    "linear-theta": lambda: theta_star_model("linear-td", 3, n_layers=3, alpha=[0.5, 0.7, 0.9], tied=False, C=np.diag([1.0, 2.0, 3.0])),
    "linear-random-f32": lambda: build_model(ModelConfig("linear-td", 2, n_layers=2, activation="tanh"), seed=3),
    "softmax-dual": lambda: theta_star_model("softmax-td", 4, n_layers=2, form="dual", score_scale=2.0),
    "softmax-tsm-untied": lambda: build_model(ModelConfig("softmax-td", 3, n_layers=3, tied=False, dtype="float64"), seed=1),
    "sarsa": lambda: theta_star_model("sarsa", 4, alpha=0.5, c=-2.0),
    "actor-critic": lambda: build_model(ModelConfig("actor-critic", 2, m=2, dtype="float64"), seed=2),
}
TASK = {"kind": "boyan", "n_states": 10, "features": "random", "n": 30}


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("key", MODELS)
def test_save_load_round_trip_is_exact(key, tmp_path):
    model = MODELS[key]()
    out = checkpoint.save(model, {"task": TASK, "n": 30, "seed": 5, "note": "kept"}, tmp_path / "ck")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name != "ck"]  # no temp dirs left behind
    loaded = checkpoint.load(out)
    assert type(loaded) is type(model) and loaded.config == model.config
    assert loaded.origin == json.loads(json.dumps(model.origin))
    for (name, a), (name_b, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert name == name_b and a.dtype == b.dtype and torch.equal(a, b)  # exact: a saved and loaded copy
    z = torch.randn(3, 9, model.config.D, dtype=model.dtype, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(z), loaded(z))  # exact: the same forward on the same weights and inputs
    config, tensors = checkpoint.read(out)
    raw = json.loads((out / "config.json").read_text())
    assert config.to_dict() == raw and config.model == model.config
    for field in ("family", "architecture", "d", "n_layers", "D", "gamma", "alpha", "form", "tied", "m", "activation",
                  "dtype", "layout"):
        assert field in raw["model"]
    assert set(raw) == {"format_version", "model", "task", "origin", "training", "seed", "package_version", "note"}
    assert raw["format_version"] == 2 and config.task.n == 30 and raw["note"] == "kept"
    assert {k: raw["task"][k] for k in TASK} == TASK and raw["task"]["family"] == model.config.family
    assert raw["model"]["layout"] == model.layout.to_dict() and raw["model"]["D"] == model.config.D
    assert sorted(tensors) == sorted(n for n, _ in model.named_parameters())
    assert all(isinstance(t, np.ndarray) for t in tensors.values())


def test_theta_star_origin_records_its_constants(tmp_path):
    config, _ = checkpoint.read(checkpoint.save(MODELS["linear-theta"](), None, tmp_path / "a"))
    assert config.origin == {"kind": "theta_star", "alpha": 0.5, "alphas": [0.5, 0.7, 0.9], "c": 1.0,
                             "C": [[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0]]}
    config, _ = checkpoint.read(checkpoint.save(MODELS["softmax-dual"](), None, tmp_path / "b"))
    assert config.origin["score_scale"] == 2.0 and config.model.form == "dual"
    assert config.constants == {"score_scale": 2.0}


def test_save_a_state_dict_with_the_model_fields_in_extras(tmp_path):
    model = theta_star_model("sarsa", 2, alpha=0.3)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    extras = {"family": "sarsa", "d": 2, "n_layers": 1, "gamma": 0.5, "alpha": 0.3, "dtype": "float64",
              "origin": {"kind": "trained", "run_id": "r1", "step": 7}}
    loaded = checkpoint.load(checkpoint.save(state, extras, tmp_path / "ck"))
    assert loaded.origin == {"kind": "trained", "run_id": "r1", "step": 7}
    assert torch.equal(loaded.blocks[0].attn.P, model.blocks[0].attn.P)  # exact: a saved and loaded copy
    with raises_user("model fields"):
        checkpoint.save(state, {"origin": {"kind": "x"}}, tmp_path / "other")
    with raises_user("family", "linear-td", "sarsa"):
        checkpoint.save(model, {"family": "linear-td"}, tmp_path / "other")


def test_overwrite_and_refusals_are_atomic(tmp_path):
    model = theta_star_model("linear-td", 2)
    out = checkpoint.save(model, None, tmp_path / "ck")
    first = checkpoint.sha256(out)
    with raises_user("already exists", "--force"):
        checkpoint.save(model, None, out)
    assert checkpoint.sha256(out) == first
    checkpoint.save(theta_star_model("linear-td", 2, alpha=0.5), None, out, overwrite=True)
    assert checkpoint.sha256(out) != first
    bad = theta_star_model("linear-td", 2)
    with torch.no_grad():
        bad.blocks[0].attn.P[0, 0] = float("nan")
    with raises_user("blocks.0.attn.P", "NaN"):
        checkpoint.save(bad, None, tmp_path / "nan")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # nothing half-written


def test_sha256_is_a_content_hash(tmp_path):
    a = checkpoint.save(theta_star_model("softmax-td", 3), {"seed": 1}, tmp_path / "a")
    b = checkpoint.save(theta_star_model("softmax-td", 3), {"seed": 1}, tmp_path / "b")
    assert checkpoint.sha256(a) == checkpoint.sha256(b) and len(checkpoint.sha256(a)) == 64
    c = checkpoint.save(theta_star_model("softmax-td", 3), {"seed": 2}, tmp_path / "c")
    assert checkpoint.sha256(c) != checkpoint.sha256(a)


def test_read_imports_neither_torch_nor_transformer_lens(tmp_path):
    out = checkpoint.save(theta_star_model("sarsa", 2), {"task": {"kind": "mdp"}}, tmp_path / "ck")
    code = ("import sys\nfrom icrl_interp import checkpoint\n"
            f"config, tensors = checkpoint.read({str(out)!r})\n"
            "assert config.family == 'sarsa' and len(tensors) == 2\n"
            "bad = [m for m in ('torch', 'transformer_lens') if m in sys.modules]\nassert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------ bad files
def _good(tmp_path: Path) -> Path:
    return checkpoint.save(theta_star_model("linear-td", 2, n_layers=2), {"task": TASK}, tmp_path / "ck")


def _edit_config(**changes):
    """Set (or, with ..., remove) config.json keys; 'model__d' is the nested key model.d."""
    def edit(ck: Path):
        config = json.loads((ck / "config.json").read_text())
        for key, value in changes.items():
            *outer, last = key.split("__")
            target = config
            for part in outer:
                target = target[part]
            if value is ...:
                target.pop(last)
            else:
                target[last] = value
        (ck / "config.json").write_text(json.dumps(config))
    return edit


def _tensors(change):
    def edit(ck: Path):
        _, tensors = checkpoint.read(ck)
        tensors = dict(tensors)
        change(tensors)
        save_file(tensors, str(ck / "model.safetensors"))
    return edit


def _write(name: str, data: bytes):
    def edit(ck: Path):
        (ck / name).write_bytes(data)
    return edit


def _truncate(keep):
    def edit(ck: Path):
        raw = (ck / "model.safetensors").read_bytes()
        (ck / "model.safetensors").write_bytes(raw[: keep(len(raw))])
    return edit


def _cut(name: str, keep):
    """Keep the first keep(size) bytes of a checkpoint file."""
    def edit(ck: Path):
        raw = (ck / name).read_bytes()
        (ck / name).write_bytes(raw[: keep(len(raw))])
    return edit


def _flip(offset):
    """Flip one byte of model.safetensors (offset(size, header length) -> where)."""
    def edit(ck: Path):
        raw = bytearray((ck / "model.safetensors").read_bytes())
        raw[offset(len(raw), int.from_bytes(raw[:8], "little"))] ^= 0x5A
        (ck / "model.safetensors").write_bytes(bytes(raw))
    return edit


def _header(change):
    """Rewrite the safetensors header JSON (change(header dict) -> new header, dict or raw bytes)."""
    def edit(ck: Path):
        raw = (ck / "model.safetensors").read_bytes()
        n = int.from_bytes(raw[:8], "little")
        head = change(json.loads(raw[8 : 8 + n]))
        head = head if isinstance(head, bytes) else json.dumps(head).encode()
        (ck / "model.safetensors").write_bytes(len(head).to_bytes(8, "little") + head + raw[8 + n :])
    return edit


def _first_tensor(header, **changes):
    name = next(k for k in header if k != "__metadata__")
    return {**header, name: {**header[name], **changes}}


DEEP = b"[" * 100_000 + b"]" * 100_000


def _replace_dir_with_file(data: bytes):
    def edit(ck: Path):
        for p in ck.iterdir():
            p.unlink()
        ck.rmdir()
        ck.write_bytes(data)
    return edit


def _only(name: str, data: bytes):
    def edit(ck: Path):
        for p in ck.iterdir():
            p.unlink()
        (ck / name).write_bytes(data)
    return edit


def _zip_bytes(tmp: Path) -> bytes:
    with zipfile.ZipFile(tmp / "x.zip", "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return (tmp / "x.zip").read_bytes()


MARKER = Path("/tmp/icrl_interp_pickle_was_executed")
# A protocol-0 pickle that would run `touch MARKER` if anything ever unpickled it.
EVIL = f"cos\nsystem\n(S'touch {MARKER}'\ntR.".encode()
PICKLE = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."
PICKLE5 = pickle.dumps({"format_version": 2}, protocol=5)  # the newest protocol: b"\x80\x05..."

BAD = {
    "missing-dir": (shutil.rmtree, ["does not exist"]),
    "plain-file": (_replace_dir_with_file(b"hello"), ["is a file", "not a checkpoint directory"]),
    "pickle-file": (_replace_dir_with_file(PICKLE), ["pickle", "never loaded"]),
    "pickle-5-file": (_replace_dir_with_file(PICKLE5), ["a Python pickle", "never loaded"]),
    "config-is-pickle-5": (_write("config.json", PICKLE5), ["config.json", "not valid JSON"]),
    "zip-file": (lambda ck: _replace_dir_with_file(_zip_bytes(ck.parent))(ck), ["zip", "torch.save"]),
    "only-a-pickle": (_only("pytorch_model.bin", EVIL), ["no model.safetensors", "pytorch_model.bin"]),
    "no-config": (lambda ck: (ck / "config.json").unlink(), ["no config.json"]),
    "config-not-json": (_write("config.json", b"{not json"), ["config.json", "not valid JSON"]),
    "config-a-list": (_write("config.json", b"[1, 2]"), ["JSON object"]),
    "no-format-version": (_edit_config(format_version=...), ["format_version"]),
    "future-format": (_edit_config(format_version=3), ["unsupported", "format_version 3"]),
    "unknown-family": (_edit_config(model__family="transformer-xl"), ["unknown family", "transformer-xl"]),
    "unknown-task-family": (_edit_config(task__family="gridworld"), ["unknown family", "gridworld"]),
    "wrong-architecture": (_edit_config(model__architecture="lsa"), ["architecture 'lsa'", "linear-attention"]),
    "no-model": (_edit_config(model=...), ["missing model"]),
    "model-not-object": (_edit_config(model=[1]), ["model must be an object"]),
    "bad-D": (_edit_config(model__D=99), ["D = 99"]),
    "bad-layout": (_edit_config(model__layout={"family": "linear-td", "blocks": {"phi": [0, 5]}, "readout_block": "phi"}),
                   ["layout"]),
    "bad-d": (_edit_config(model__d=2.5), ["d must be a positive integer"]),
    "no-origin": (_edit_config(origin=...), ["missing origin"]),
    "origin-no-kind": (_edit_config(origin={"run": 1}), ["origin", "kind"]),
    "bad-gamma": (_edit_config(model__gamma=1.5), ["gamma"]),
    "bad-n": (_edit_config(task__n=-3), ["task n must be a positive integer"]),
    "task-not-object": (_edit_config(task="boyan"), ["task"]),
    "unknown-task-key": (_edit_config(task__horizon=3), ["task config has unknown keys", "horizon"]),
    "training-not-object": (_edit_config(training=[1]), ["training must be an object"]),
    "shapes-vs-config": (_edit_config(model__d=3, model__D=7, model__layout=ModelConfig("linear-td", 3).layout.to_dict()),
                         ["shape", "D = 7"]),
    "untied-needs-more": (_edit_config(model__tied=False), ["missing tensors", "blocks.1.attn.P"]),
    "extra-tensor": (_tensors(lambda t: t.update(extra=np.zeros((5, 5)))), ["unexpected tensors", "extra"]),
    "missing-tensor": (_tensors(lambda t: t.pop("blocks.0.attn.Q")), ["missing tensors", "blocks.0.attn.Q"]),
    "nan": (_tensors(lambda t: t["blocks.0.attn.P"].__setitem__((0, 0), np.nan)), ["blocks.0.attn.P", "NaN"]),
    "inf": (_tensors(lambda t: t["blocks.0.attn.Q"].__setitem__((1, 1), -np.inf)), ["blocks.0.attn.Q", "Inf"]),
    "wrong-dtype": (_tensors(lambda t: t.update({k: v.astype(np.float32) for k, v in t.items()})), ["float32", "dtype float64"]),
    "int-tensor": (_tensors(lambda t: t.update({"blocks.0.attn.P": np.zeros((5, 5), np.int64)})), ["I64", "float32 or float64"]),
    "truncated": (_truncate(lambda n: n - 10), ["truncated"]),
    "truncated-header": (_truncate(lambda n: 4), ["truncated"]),
    "cut-in-header": (_truncate(lambda n: 40), ["truncated"]),
    "padded": (lambda ck: (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes() + b"\0" * 8), ["padded"]),
    "weights-are-pickle": (_write("model.safetensors", PICKLE + b"\0" * 64), ["pickle", "never loaded"]),
    "weights-are-pickle-5": (_write("model.safetensors", PICKLE5 + b"\0" * 64), ["a Python pickle", "never loaded"]),
    "weights-are-evil-pickle": (_write("model.safetensors", EVIL), ["not a safetensors file"]),
    "weights-garbage": (_write("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00not-json-at-all!"), ["not a safetensors file"]),
    # corrupt and truncated files (docs/integrity.md, "One-line errors")
    "weights-empty": (_cut("model.safetensors", lambda n: 0), ["truncated"]),
    "weights-cut-after-length": (_cut("model.safetensors", lambda n: 9), ["truncated"]),
    "weights-cut-in-half": (_cut("model.safetensors", lambda n: n // 2), ["truncated"]),
    "weights-last-byte-cut": (_cut("model.safetensors", lambda n: n - 1), ["truncated"]),
    "header-length-flipped": (_flip(lambda n, h: 3), ["truncated or not a safetensors file"]),
    "header-brace-flipped": (_flip(lambda n, h: 8), ["not a safetensors file"]),
    "header-offsets-flipped": (_header(lambda h: _first_tensor(h, data_offsets=[0, 10**30])), ["truncated or padded"]),
    "header-dtype-a-list": (_header(lambda h: _first_tensor(h, dtype=["F64"])), ["dtype"]),
    "header-shape-mismatch": (_header(lambda h: _first_tensor(h, shape=[3, 3])), ["could not be read as safetensors"]),
    "header-deeply-nested": (_header(lambda h: DEEP), ["not a safetensors file"]),
    "config-empty": (_cut("config.json", lambda n: 0), ["config.json", "not valid JSON"]),
    "config-cut-in-half": (_cut("config.json", lambda n: n // 2), ["config.json", "not valid JSON"]),
    "config-last-byte-cut": (_cut("config.json", lambda n: n - 2), ["config.json", "not valid JSON"]),
    "config-not-utf8": (_write("config.json", b'{"format_version": "\xff\xfe"}'), ["config.json", "not valid JSON"]),
    "config-deeply-nested": (_write("config.json", DEEP), ["config.json", "nested too deeply"]),
    "config-deeply-nested-inside": (lambda ck: _edit_config(origin=0)(ck) or (ck / "config.json").write_bytes(
        (ck / "config.json").read_bytes().replace(b'"origin": 0', b'"origin": ' + DEEP)), ["config.json", "nested too deeply"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_checkpoints_are_refused_with_a_named_problem(case, tmp_path):
    MARKER.unlink(missing_ok=True)
    ck = _good(tmp_path)
    edit, words = BAD[case]
    edit(ck)
    for loader in (checkpoint.read, checkpoint.load):
        with raises_user(*words) as info:
            loader(ck)
        assert "\n" not in str(info.value)
    assert not MARKER.exists()


FORMAT_1 = Path(__file__).parent.parent / "fixtures" / "format_v1"
"""Checkpoints written by format-1 code (icrl_interp before the family registry), one per family."""

BAD_FORMAT_1 = {
    "unknown-family": (_edit_config(family="transformer-xl"), ["unknown family", "transformer-xl"]),
    "bad-D": (_edit_config(D=99), ["D = 99"]),
    "bad-n": (_edit_config(n=-3), ["n must be a positive integer"]),
    "no-layout": (_edit_config(layout=...), ["missing layout"]),
    "task-not-object": (_edit_config(task="boyan"), ["task"]),
    "bad-gamma": (_edit_config(gamma=1.5), ["gamma"]),
}


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa", "actor-critic"])
def test_format_1_checkpoints_still_load(family, tmp_path):
    src = FORMAT_1 / f"ckpt-{family}"
    raw = json.loads((src / "config.json").read_text())
    assert raw["format_version"] == 1
    config, tensors = checkpoint.read(src)
    assert config.family == config.task.family == raw["family"] and config.model.d == raw["d"]
    renamed = registry.get(family).current_config(raw)["origin"]  # actor-critic's origin.beta is origin.critic_step
    assert config.task.n == raw["n"] and config.origin == renamed and config.model.layout.to_dict() == raw["layout"]
    model = checkpoint.load(src)
    assert sorted(tensors) == sorted(n for n, _ in model.named_parameters())
    # re-saving writes format 2 with the same content
    out = checkpoint.save(model, config, tmp_path / "v2")
    again, _ = checkpoint.read(out)
    assert again == config and json.loads((out / "config.json").read_text())["format_version"] == 2


@pytest.mark.parametrize("case", BAD_FORMAT_1)
def test_bad_format_1_configs_are_refused(case, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(FORMAT_1 / "ckpt-linear-td", ck)
    edit, words = BAD_FORMAT_1[case]
    edit(ck)
    with raises_user(*words) as info:
        checkpoint.read(ck)
    assert "\n" not in str(info.value)


def test_inspect_style_validation_of_config_dicts():
    with raises_user("format_version"):
        checkpoint.validate_config({"family": "sarsa"})
    good = checkpoint.make_config(ModelConfig("sarsa", 2), {"seed": 3})
    assert checkpoint.validate_config(good.to_dict()) == good and good.model == ModelConfig("sarsa", 2)
    with pytest.raises(UserError):
        checkpoint.make_config(ModelConfig("sarsa", 2), {"seed": "three"})
