"""Golden JSON outputs of the command line, to show that a refactor reproduces them bit for bit.

    .venv/bin/python tests/golden/make_golden.py                   # write tests/golden/outputs/*.json
    .venv/bin/python tests/golden/make_golden.py --check           # regenerate into a temp dir and compare
    .venv/bin/python tests/golden/make_golden.py --check --exact   # ... with floats compared bit for bit

What is frozen (`cases`): `analyze` of each shipped checkpoint in data/checkpoints/ (its weights, its
recording made by `record`, and `analyze --live`), `record --also-analyze`, `analyze` of the format-1
fixtures of tests/fixtures/format_v1/ (checkpoints and recordings), a user's own models of examples/
(`--model FILE.py:make` with weights, live and recorded: a plain PyTorch one with its probe spec and a
TransformerLens one), `verdict` of a shipped checkpoint (with its causal evidence) and of a recording,
`causal` on a shipped checkpoint (with its random-init copy), and `inspect --json` of every shipped
checkpoint and of one format-1 checkpoint. Every run is tiny (16 to 32 prompts, 20 bootstrap resamples)
and seeded.

Every command runs in this one process through `icrl_interp.cli.main`, the function behind the
`icrl-interp` console script: a fresh process per command would spend seconds per command on imports
alone. The global RNGs are reseeded before each command, so no output depends on the order of the
commands (measured: none depends on the global RNGs at all). BLAS and torch run on one thread.

Comparing (`--check`), in one of three modes:

- `values` (the default, when this machine's float kernels are those the outputs were written with,
  outputs/machine.json): the structure (keys, list lengths, JSON types), every string, int, bool and null
  exactly; floats within REL_TOL relative plus ABS_EPS eps of float64 at the output's scale (the
  largest magnitude of the stored output's floats), so a quantity that is 0 in exact arithmetic is
  judged at the scale of what it was computed from. Numbers printed inside strings (the verdict's
  sentences) are compared the same way, the text around them exactly. The same machine reproduces
  every bit (measured), so this tolerance is margin, not noise.
- `exact` (`--exact`): floats bit for bit (-0.0 is not 0.0): before and after a change that must not
  move a number, on the machine the outputs were written on.
- `structure` (chosen when the machine differs): keys, list lengths and JSON types only; no value.
  On other float kernels no tolerance holds (measured under the BLAS/SIMD variables of
  docs/development.md, "Floats in tests"): the recordings and most models are float32, so their
  analyses move by ~1e-7 relative, and at these tiny sizes the ridge probes' cross-validated penalty
  flipped between near-tied grid points (analyzers/td_probe.py, then a strict `argmin(cv)`; now
  `tied_choice`, which makes such flips rare but not impossible), which moved R² values by up to 0.1
  and the strings chosen from them (`max_baseline`: 'input' -> 'shuffled').

Every differing path is printed, with both values.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import random
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUTPUTS = HERE / "outputs"
MACHINE = "machine"
"""NAME.json beside the outputs: what made their floats (CPU, SIMD, libraries, kernel variables; `machine`)."""

SHIPPED = REPO / "data" / "checkpoints"
FORMAT_V1 = REPO / "tests" / "fixtures" / "format_v1"
EXAMPLES = REPO / "examples"
FAMILIES = ["linear-td", "softmax-td", "sarsa", "actor-critic"]
PROMPTS = ["--tasks", "16", "--batch-size", "8"]
"""Every recording and live analysis: 16 prompts (one task each), two batches."""
SEED = "0"
USER_TASK = ["--task", "linear-td", "--d", "4", "--n", "30", "--n-layers", "3"]
"""The task the examples' models read (examples/README.md)."""

# ------------------------------------------------------------------ the one list of what may vary
VARYING_KEYS = {
    "versions": "verdict's {icrl_interp, numpy} versions: the installed packages, not the result",
}
"""Keys dropped wherever they occur, each with why it varies between runs of the same code. Nothing
else is dropped: the commands write no timestamps, durations or host names into their JSON."""
PLACEHOLDERS = {
    "<work>": "the temporary folder the commands write into: a new one each run",
    "<repo>": "the checkout's absolute path: input paths (checkpoints, fixtures, the examples' models)",
}
"""Absolute path prefixes inside strings, replaced by a placeholder; the rest of each path is compared."""

REL_TOL = 1e-9
ABS_EPS = 64
"""`values` mode: |a - b| <= REL_TOL * max(|a|, |b|) + ABS_EPS * eps(float64) * scale."""
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?\b(?:nan|inf)\b")
KERNEL_ENV = ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR",
              "OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES")
"""Environment variables that change which float kernels run (docs/development.md)."""
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


# ------------------------------------------------------------------ what is run
def cases(work: Path) -> list[tuple[str | None, list[str]]]:
    """(name of the golden output, or None for a step that only prepares a file; the argv). A named case
    writes work/NAME.json with --json."""
    w = lambda name: str(work / name)  # noqa: E731
    run: list[tuple[str | None, list[str]]] = []

    def case(name: str, *argv: str) -> None:
        run.append((name, [*argv, "--json", w(f"{name}.json")]))

    for fam in FAMILIES:
        ck = str(SHIPPED / fam)
        case(f"analyze-checkpoint-{fam}", "analyze", ck)
        run.append((None, ["record", ck, "--out", w(f"{fam}.h5"), *PROMPTS, "--prompt-seed", SEED, "--no-progress"]))
        case(f"analyze-recording-{fam}", "analyze", w(f"{fam}.h5"))
        case(f"analyze-live-{fam}", "analyze", ck, "--live", *PROMPTS, "--prompt-seed", SEED)
        case(f"inspect-{fam}", "inspect", ck)
    case("record-also-analyze-linear-td", "record", str(SHIPPED / "linear-td"), "--out", w("also.h5"), *PROMPTS,
         "--prompt-seed", SEED, "--no-progress", "--also-analyze")
    for fam in FAMILIES:
        case(f"format_v1-analyze-checkpoint-{fam}", "analyze", str(FORMAT_V1 / f"ckpt-{fam}"))
        case(f"format_v1-analyze-recording-{fam}", "analyze", str(FORMAT_V1 / f"rec-{fam}.h5"))
    case("format_v1-inspect-linear-td", "inspect", str(FORMAT_V1 / "ckpt-linear-td"))
    for which, probe in (("torch", ["--probe", str(EXAMPLES / "torch_model.toml")]), ("tl", [])):
        model = ["--model", f"{EXAMPLES / f'{which}_model.py'}:make", "--weights", w(f"{which}.safetensors"),
                 *USER_TASK, *probe]
        run.append((None, ["record", *model, "--out", w(f"user-{which}.h5"), *PROMPTS, "--prompt-seed", SEED,
                           "--no-progress"]))
        case(f"user-{which}-analyze-recording", "analyze", w(f"user-{which}.h5"))
        case(f"user-{which}-analyze-live", "analyze", "--live", *model, *PROMPTS, "--prompt-seed", SEED)
    ck = str(SHIPPED / "linear-td")
    case("verdict-checkpoint-linear-td", "verdict", ck, "--tasks", "32", "--batch-size", "16", "--prompt-seed", SEED,
         "--split-seed", SEED, "--direction-seed", SEED, "--bootstrap", "20", "--random-draws", "2",
         "--causal-tasks", "8")
    case("verdict-recording-linear-td", "verdict", w("linear-td.h5"), "--split-seed", SEED, "--bootstrap", "20")
    case("causal-linear-td", "causal", ck, "--layer", "0", "--tasks", "32", "--prompt-seed", SEED, "--split-seed", SEED,
         "--direction-seed", SEED, "--random-draws", "2", "--bootstrap", "20", "--steer", "1")
    return run


def _seed_everything() -> None:
    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _user_weights(work: Path) -> None:
    """The examples' models at a seeded initialization, saved as their --weights (what a user's training
    saves), so the outputs do not hang on the torch RNG state when the package calls make()."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(EXAMPLES))
    try:
        for which in ("torch", "tl"):
            module = __import__(f"{which}_model")
            torch.manual_seed(0)
            save_file(module.make().state_dict(), str(work / f"{which}.safetensors"))
    finally:
        sys.path.remove(str(EXAMPLES))


def generate(work: Path, verbose: bool = False) -> dict[str, object]:
    """Run every case into `work`; the normalized outputs by name."""
    import torch

    from icrl_interp import cli

    torch.set_num_threads(1)
    _user_weights(work)
    results = {}
    for name, argv in cases(work):
        _seed_everything()
        stdout, stderr = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(argv)
        if code != 0:
            raise SystemExit(f"make_golden: `icrl-interp {' '.join(argv)}` exited {code}:\n{stderr.getvalue()}")
        if verbose:
            print(f"{time.perf_counter() - t0:6.2f} s  {name or '(prepares a file)'}: icrl-interp {argv[0]}")
        if name is not None:
            results[name] = normalize(json.loads((work / f"{name}.json").read_text()), work)
    return results


def machine() -> dict[str, object]:
    """What decides which float kernels run here: two runs that agree on all of it give the same bits."""
    from importlib import metadata

    import numpy
    import torch

    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
              if line.startswith("model name")]
    return {"cpu": models[0] if models else platform.processor(), "arch": platform.machine(),
            "python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "transformer_lens": metadata.version("transformer-lens"),
            "numpy_simd": sorted(k for k, on in __cpu_features__.items() if on),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "env": {k: os.environ.get(k) for k in KERNEL_ENV}}


# ------------------------------------------------------------------ normalizing, writing, reading
def normalize(value, work: Path):
    """`value` without the VARYING_KEYS, and with the PLACEHOLDERS' absolute paths replaced."""
    if isinstance(value, dict):
        return {k: normalize(v, work) for k, v in value.items() if k not in VARYING_KEYS}
    if isinstance(value, list):
        return [normalize(v, work) for v in value]
    if isinstance(value, str):  # the work folder first: it may lie inside the checkout
        return value.replace(str(work.resolve()), "<work>").replace(str(REPO), "<repo>")
    return value


def dumps(value) -> str:
    return json.dumps(value, indent=1, sort_keys=True) + "\n"


def write(results: dict[str, object], here: dict, folder: Path) -> None:
    """The outputs as folder/NAME.json, and the machine as folder/machine.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        if old.stem not in results and old.stem != MACHINE:
            old.unlink()  # a case no longer run
    for name, value in {**results, MACHINE: here}.items():
        (folder / f"{name}.json").write_text(dumps(value))


def load(folder: Path) -> tuple[dict[str, object], dict | None]:
    """The outputs of `folder` by name, and its machine (None when it has none)."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    return found, found.pop(MACHINE, None)


# ------------------------------------------------------------------ comparing
def _floats(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, (dict, list)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _floats(v)


def scale_of(value) -> float:
    """The largest finite magnitude among the floats of an output (1 when there is none, or all are 0)."""
    return max((abs(x) for x in _floats(value) if math.isfinite(x)), default=0.0) or 1.0


def floats_match(a: float, b: float, mode: str, scale: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    if mode == "exact":
        return a.hex() == b.hex()
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) + ABS_EPS * sys.float_info.epsilon * scale


def strings_match(a: str, b: str, mode: str, scale: float) -> bool:
    """The same text around the numbers, and numbers that match as floats in `mode`."""
    if a == b or mode == "exact":
        return a == b
    na, nb = NUMBER.findall(a), NUMBER.findall(b)
    return (NUMBER.split(a) == NUMBER.split(b) and len(na) == len(nb)
            and all(floats_match(float(x), float(y), mode, scale) for x, y in zip(na, nb)))


def compare(expected, actual, mode: str = "values", scale: float | None = None, path: str = "") -> list[str]:
    """Every path at which `actual` differs from `expected` in `mode`, with both values."""
    if scale is None:
        scale = scale_of(expected)
    where = path or "/"
    if type(expected) is not type(actual):
        return [f"{where}: type {type(expected).__name__} -> {type(actual).__name__} ({expected!r} -> {actual!r})"]
    if isinstance(expected, dict):
        diffs = [f"{path}/{k}: missing" for k in expected if k not in actual]
        diffs += [f"{path}/{k}: extra key, {actual[k]!r}" for k in actual if k not in expected]
        for k in expected.keys() & actual.keys():
            diffs += compare(expected[k], actual[k], mode, scale, f"{path}/{k}")
        return sorted(diffs)
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return [f"{where}: length {len(expected)} -> {len(actual)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in compare(e, a, mode, scale, f"{path}/{i}")]
    if mode == "structure":
        return []  # the same JSON type (above), any value
    if isinstance(expected, float):
        if floats_match(expected, actual, mode, scale):
            return []
        return [f"{where}: {expected!r} -> {actual!r} (difference {actual - expected:.3g}, scale {scale:.3g})"]
    if isinstance(expected, str):
        return [] if strings_match(expected, actual, mode, scale) else [f"{where}: {expected!r} -> {actual!r}"]
    return [] if expected == actual else [f"{where}: {expected!r} -> {actual!r}"]  # int, bool, None: exact


def compare_sets(stored: dict[str, object], fresh: dict[str, object], mode: str = "values") -> list[str]:
    """Differences between two sets of outputs, each line prefixed by the output's name."""
    diffs = [f"{name}: missing from the new outputs" for name in stored if name not in fresh]
    diffs += [f"{name}: a new output, not stored" for name in fresh if name not in stored]
    for name in stored:
        if name in fresh:
            diffs += [f"{name}:{d}" for d in compare(stored[name], fresh[name], mode)]
    return diffs


def mode_for(exact: bool, stored_machine: dict | None, here: dict) -> tuple[str, list[str]]:
    """The comparison mode, and what differs between the machine the outputs were written on and this one."""
    if stored_machine is None:
        differs = [f"no {MACHINE}.json"]
    else:
        differs = sorted(k for k in stored_machine.keys() | here.keys() if stored_machine.get(k) != here.get(k))
    return ("exact" if exact else "structure" if differs else "values"), differs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with the stored outputs")
    parser.add_argument("--exact", action="store_true", help="with --check: floats bit for bit")
    parser.add_argument("--stored", type=Path, default=OUTPUTS, help="the stored outputs (default: %(default)s)")
    parser.add_argument("--fresh", type=Path, help="with --check: compare the outputs in this folder (written by "
                        "--keep) instead of regenerating them")
    parser.add_argument("--keep", type=Path, help="with --check: also write the regenerated outputs here")
    parser.add_argument("--verbose", action="store_true", help="time each command")
    args = parser.parse_args(argv)
    if (args.exact or args.fresh or args.keep) and not args.check:
        parser.error("--exact, --fresh and --keep go with --check")
    t0 = time.perf_counter()
    if args.fresh:
        fresh, here = load(args.fresh)
    else:
        with tempfile.TemporaryDirectory(prefix="icrl-golden-") as tmp:
            fresh = generate(Path(tmp), verbose=args.verbose)
        here = machine()
    if not args.check:
        write(fresh, here, args.stored)
        print(f"wrote {len(fresh)} outputs and {MACHINE}.json to {args.stored} in {time.perf_counter() - t0:.1f} s")
        return 0
    if args.keep:
        write(fresh, here, args.keep)
    stored, stored_machine = load(args.stored)
    mode, differs = mode_for(args.exact, stored_machine, here or {})
    if differs:
        print(f"the stored outputs were written on other float kernels ({', '.join(differs)} differ)"
              + ("" if args.exact else ": comparing their structure, not their floats"))
    diffs = compare_sets(stored, fresh, mode)
    for line in diffs:
        print(line)
    how = {"exact": "floats bit for bit", "structure": "structure, floats not compared",
           "values": f"floats to rel {REL_TOL:g} + {ABS_EPS} eps x scale"}[mode]
    print(f"{len(fresh)} outputs, {len(diffs)} differences (mode {mode}: {how}) in {time.perf_counter() - t0:.1f} s")
    return 1 if diffs else 0


if __name__ == "__main__":
    for _var in ONE_THREAD:
        os.environ.setdefault(_var, "1")  # before numpy loads: one BLAS thread, the same bits every run
    sys.exit(main())
