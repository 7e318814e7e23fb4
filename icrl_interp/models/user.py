"""A user's own model: `FILE.py:FUNC` or `package.module:FUNC` returning a `torch.nn.Module`.

The callable takes no arguments and returns a module whose forward takes the task's prompt tensor
z[batch, pos, d_model] (any embedding lives inside the module) and returns its prediction. Weights,
when given, are a safetensors state dict loaded strictly: a missing, unexpected or misshapen tensor is
a one-line error, never a half-loaded model. Nothing is unpickled (docs/byom.md).

Wherever the user's code runs (importing the file, calling FUNC, its forward pass through `forward`),
an exception or a `sys.exit` becomes one `UserError` line naming what happened; so do parameters
holding NaN or Inf (`load`) and a non-finite output (`check_output`, per batch). What the model returns
is read as one prediction per prompt by `per_prompt_output` (a shape it cannot be read as is refused).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..core.errors import ModelFault, UserError, one_line


def _exit(e: SystemExit) -> str:
    """How a sys.exit reads in a message: 'exited with status 3' (None counts as 0)."""
    code = 0 if e.code is None else e.code
    return f"exited with status {code}" if isinstance(code, int) else f"called sys.exit({code!r})"


def _import_file(path: Path):
    """Import a Python file as a module (its directory joins sys.path for its own imports)."""
    name = f"icrl_user_model_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except UserError:
        sys.modules.pop(name, None)
        raise
    except SystemExit as e:  # the file ended the program: say so, instead of exiting silently
        sys.modules.pop(name, None)
        raise UserError(f"model file {path} {_exit(e)} on import") from None
    except Exception as e:  # the user's file failed: say where, in one line
        sys.modules.pop(name, None)
        raise UserError(f"importing {path} failed: {one_line(e)}") from None
    finally:
        if added:
            sys.path.remove(folder)
    return module


def resolve(spec: str):
    """The callable a model spec names: 'file.py:FUNC' or 'package.module:FUNC'."""
    target, sep, func = str(spec).rpartition(":")
    if not sep or not target or not func.isidentifier():
        raise UserError(f"--model {spec!r}: expected FILE.py:FUNC or package.module:FUNC")
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise UserError(f"--model {spec!r}: file {path} does not exist")
        module = _import_file(path)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise UserError(f"--model {spec!r}: cannot import module {target!r} ({e})") from None
        except SystemExit as e:
            raise UserError(f"--model {spec!r}: module {target} {_exit(e)} on import") from None
        except Exception as e:
            raise UserError(f"--model {spec!r}: importing {target} failed: {one_line(e)}") from None
    fn = getattr(module, func, None)
    if fn is None:
        raise UserError(f"--model {spec!r}: {target} has no attribute {func!r}")
    if not callable(fn):
        raise UserError(f"--model {spec!r}: {func} is a {type(fn).__name__}, not a callable")
    return fn


def load_weights(model, weights) -> None:
    """Load a safetensors state dict into `model`, strictly (every tensor present, no extra, same shapes)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(weights)
    if not path.is_file():
        raise UserError(f"--weights {path} does not exist")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"--weights {path}: not a readable safetensors file ({e})") from None
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    if extra:
        problems.append(f"unexpected {', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}")
    if wrong:
        k = wrong[0]
        problems.append(f"{k} has shape {tuple(state[k].shape)}, the model's is {tuple(own[k].shape)}"
                        + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""))
    if problems:
        raise UserError(f"--weights {path} do not fit the model: {'; '.join(problems)}")
    with torch.no_grad():
        model.load_state_dict(state, strict=True)


def load(spec: str, weights=None):
    """Build the user's model from a spec ('file.py:FUNC' or 'package.module:FUNC') and optional weights."""
    from torch import nn

    fn = resolve(spec)
    try:
        model = fn()
    except UserError:
        raise
    except SystemExit as e:
        raise UserError(f"--model {spec!r}: {getattr(fn, '__name__', fn)}() {_exit(e)}") from None
    except Exception as e:
        raise UserError(f"--model {spec!r}: calling {getattr(fn, '__name__', fn)}() failed: {one_line(e)}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {spec!r}: {getattr(fn, '__name__', 'the callable')}() returned "
                        f"{type(model).__name__}, not a torch.nn.Module")
    if weights is not None:
        load_weights(model, weights)
    check_parameters(model, f"--weights {weights}" if weights is not None else f"--model {spec!r}")
    return model


def check_parameters(model, source: str) -> None:
    """Refuse a model whose parameters hold NaN or Inf (what a diverged training run saves): every output
    would be NaN, and nothing recorded from it could be read."""
    import torch

    for name, p in model.named_parameters():
        if p.is_floating_point() and p.numel():
            bad = int((~torch.isfinite(p.detach())).sum())
            if bad:
                raise UserError(f"{source}: parameter {name} is not finite ({bad} of {p.numel()} values NaN or Inf)")


def forward(model, x):
    """`model(x)` for a user's model: an exception its code raises, or a sys.exit in it, becomes one
    UserError line (the package's own models keep their tracebacks: there it is a bug)."""
    try:
        return model(x)
    except UserError:
        raise
    except SystemExit as e:
        code = 0 if e.code is None else e.code
        raise ModelFault(f"the model called sys.exit({code!r}) during its forward pass") from None
    except MemoryError:
        raise  # the CLI's one line says "out of memory"
    except Exception as e:
        raise ModelFault(f"the model raised {one_line(e)} (its input: prompts z of shape {tuple(x.shape)}, "
                        f"{str(x.dtype).removeprefix('torch.')})") from e


def check_output(y, what: str, where: str) -> None:
    """Refuse an output (an array) holding NaN or Inf: `what` (the model's output, the readout of layer l,
    ...) `where` (in batch k of K, prompts a..b). Checked per batch, so a NaN in the last batch is refused too."""
    import numpy as np

    y = np.asarray(y)
    if y.dtype.kind in "fc" and not np.isfinite(y).all():
        raise ModelFault(f"non-finite output: {what} holds {'NaN' if np.isnan(y).any() else 'Inf'} in {where}")


def per_prompt_output(y, batch: int, width: int | None, what: str = "the model's output"):
    """A model's prediction as a tensor [batch, k]: [B] -> [B, 1]; [B, k]; [B, pos, k] -> the last position.
    `width` (the task's reference output width) must equal k when given. A tuple (or list, dict) is
    refused, not guessed at: which element is the prediction is the model's to say (docs/byom.md)."""
    import torch

    if not isinstance(y, torch.Tensor):
        k = f" of {len(y)}" if isinstance(y, (tuple, list, dict)) else ""
        raise UserError(f"{what} is a {type(y).__name__}{k}, not a tensor: return the prediction as one tensor "
                        "[batch, k] or [batch, pos, k]")
    shape = tuple(y.shape)
    if y.ndim == 0 or y.shape[0] != batch or y.ndim > 3:
        raise UserError(f"{what} has shape {shape}; expected [batch, k] or [batch, pos, k] with batch = {batch}")
    y = y.reshape(batch, 1) if y.ndim == 1 else (y[:, -1] if y.ndim == 3 else y)
    if width is not None and y.shape[1] != width:
        raise UserError(f"{what} has shape {shape}: {y.shape[1]} value(s) per prompt, the task's output has {width} "
                        f"(return [batch, {width}] or [batch, pos, {width}])")
    return y.detach()
