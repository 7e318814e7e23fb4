"""A user's own model: `FILE.py:FUNC` or `package.module:FUNC` returning a `torch.nn.Module`.

The callable takes no arguments and returns a module whose forward takes the task's prompt tensor
z[batch, pos, d_model] (any embedding lives inside the module) and returns its prediction. Weights,
when given, are a safetensors state dict loaded strictly: a missing, unexpected or misshapen tensor is
a one-line error, never a half-loaded model. Nothing is unpickled (docs/byom.md).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..errors import UserError


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
    except Exception as e:  # the user's file failed: say where, in one line
        sys.modules.pop(name, None)
        raise UserError(f"importing {path} failed: {type(e).__name__}: {e}") from None
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
        except Exception as e:
            raise UserError(f"--model {spec!r}: importing {target} failed: {type(e).__name__}: {e}") from None
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
    except Exception as e:
        raise UserError(f"--model {spec!r}: calling {getattr(fn, '__name__', fn)}() failed: {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {spec!r}: {getattr(fn, '__name__', 'the callable')}() returned "
                        f"{type(model).__name__}, not a torch.nn.Module")
    if weights is not None:
        load_weights(model, weights)
    return model
