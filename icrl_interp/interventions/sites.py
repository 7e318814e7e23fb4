"""Where an intervention happens on a model, and the model's forward pass with an edit there: the hook
of one layer (`Site`, `site_of`: TransformerLens names, or a probe spec's [roles] for any torch module),
the forward on prompts with the edit applied at its context columns (`Runner`), and the rounding floor
within which an edited output counts as unchanged (docs/causal.md#the-rounding-floor).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import UserError
from ..families import registry
from ..models.modes import eval_mode
from .edits import Edit

SITES = {
    "resid_post": "blocks.{layer}.hook_resid_post",
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
}
"""Where the test can intervene (canonical TransformerLens names; the first three are also roles)."""


@dataclass(frozen=True)
class Site:
    """Where the edit happens: one hook of one layer, on the context columns."""

    hook: str
    """Short name (a key of SITES)."""
    layer: int
    canonical: str
    """TransformerLens name, e.g. blocks.2.hook_resid_post."""
    point: str
    """The model's own hook or module path ('#k': element k of a tuple output)."""
    kind: str
    """'columns' (one feature vector per position) or 'scores' (the last query row, one entry per head)."""
    n_layers: int


def own_model(model) -> bool:
    """Whether `model` is one of the package's models (a registered family's architecture and config)."""
    from ..models.config import ModelConfig

    return isinstance(getattr(model, "config", None), ModelConfig)


def _has_tl_hooks(model) -> bool:
    return any(isinstance(getattr(m, "hook_dict", None), dict) and m.hook_dict for m in model.modules())


def check_int(name: str, value, low: int = 0) -> int:
    """`value` as an int, refused (naming the flag `name`) unless it is an integer >= `low`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise UserError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def default_hook(model) -> str:
    """The package's models: the first hook of the family's `Hints.primary_probe` (sarsa / actor-critic:
    the attention scores, where delta sits); any other model: resid_post."""
    if own_model(model):
        for hook in registry.get(model.config.family).hints.primary_probe:
            for short, name in SITES.items():
                if name.split("{layer}.", 1)[1] == hook:
                    return short
    return "resid_post"


def site_of(model, layer: int, hook: str | None = None, roles: dict | None = None) -> Site:
    """Resolve (layer, hook) on `model`: TransformerLens names where the model has them, else [roles]."""
    from ..recording.capture import hookable, role_points

    hook = default_hook(model) if hook is None else hook
    if hook not in SITES:
        raise UserError(f"--hook {hook!r}: expected one of {', '.join(SITES)}")
    layer = check_int("--layer", layer)
    template = SITES[hook]
    if roles:
        points = role_points(model, dict(roles))
    elif own_model(model) or _has_tl_hooks(model):
        points = {name: name for name in hookable(model) if name.startswith("blocks.")}
    else:
        raise UserError(f"{type(model).__name__} is not a TransformerLens model: give a probe spec whose [roles] map "
                        f"resid_post (and resid_pre / attn_out) to its modules (docs/byom.md)")
    tail = template.split("{layer}", 1)[1]
    layers = sorted(int(name.split(".")[1]) for name in points
                    if name.endswith(tail) and name.split(".")[1].isdigit() and name == template.format(layer=name.split(".")[1]))
    if not layers:
        how = "a TransformerLens attn.hook_attn_scores hook" if hook == "attn_scores" else f"role {hook}"
        raise UserError(f"--hook {hook}: the model has no {template.format(layer='L')} (it needs {how})")
    if layer not in layers:
        raise UserError(f"--layer {layer}: the model has {hook} at layers {layers[0]}..{layers[-1]}")
    n_layers = int(getattr(model, "n_layers", 0) or 0) if own_model(model) else max(layers) + 1
    canonical = template.format(layer=layer)
    return Site(hook, layer, canonical, points[canonical], "scores" if hook == "attn_scores" else "columns",
                max(n_layers, max(layers) + 1))


# ------------------------------------------------------------------------- running
def _dtype_device(model):
    import torch

    p = next(iter(model.parameters()), None)
    return (p.dtype, p.device) if p is not None else (torch.float32, torch.device("cpu"))


def _features(t, kind: str, n: int) -> np.ndarray:
    """[B, n, F] float64 features at the context columns of a captured activation."""
    if kind == "scores":
        t = t[:, :, -1, :n].transpose(1, 2)
    else:
        t = t[:, :n].reshape(t.shape[0], n, -1)
    return t.detach().to("cpu").double().numpy()


def _edit_hook(kind: str, n: int, edit: Edit):
    def fn(t):
        if kind == "scores":
            out = t.clone()
            out[:, :, -1, :n] = edit.apply(t[:, :, -1, :n].transpose(1, 2)).transpose(1, 2)
            return out
        B, pos = t.shape[0], t.shape[1]
        flat = t.reshape(B, pos, -1).clone()
        flat[:, :n] = edit.apply(flat[:, :n])
        return flat.reshape(t.shape)
    return fn


class Runner:
    """The model's forward on prompts, with an optional edit at the site; returns the output [B, k]."""

    def __init__(self, model, site: Site, pos: int, width: int | None, batch_size: int = 256):
        self.model, self.site, self.pos, self.width = model, site, pos, width
        self.n = pos - 1
        self.dtype, self.device = _dtype_device(model)
        self.batch_size = batch_size
        self.own = own_model(model)
        if self.own:
            hints = registry.get(model.config.family).hints
            self.blocks = list(hints.output_blocks) if hints.output == "parameters" else None

    def output(self, y, batch: int) -> np.ndarray:
        if self.own:
            lay = self.model.layout
            if self.blocks:
                y = np.concatenate([y[:, -1, lay.slice(b)].detach().cpu().double().numpy() for b in self.blocks], -1)
            else:
                y = lay.readout(y).detach().cpu().double().numpy()
            return y.reshape(batch, -1)
        from ..models.user import per_prompt_output

        return per_prompt_output(y, batch, self.width).cpu().double().numpy()

    def _check(self, t) -> None:
        shape = tuple(t.shape)
        if self.site.kind == "scores":
            ok = t.ndim == 4 and shape[2] == shape[3] == self.pos
            want = f"[batch, heads, {self.pos}, {self.pos}]"
        else:
            ok = t.ndim >= 3 and shape[1] == self.pos
            want = f"[batch, {self.pos}, width] (one vector per prompt position)"
        if not ok:
            raise UserError(f"{self.site.canonical} ({self.site.point}) has shape {shape}, expected {want}")

    def run(self, z: np.ndarray, edit: Edit | None = None, features: bool = False):
        """(outputs [B, k], features [B, n, F] or None) of prompts z, in batches."""
        import torch

        from ..models import user
        from ..recording.capture import capture, intervene

        forward = (lambda x: self.model(x)) if self.own else (lambda x: user.forward(self.model, x))
        outs, feats = [], []
        n_batches = -(-z.shape[0] // self.batch_size)
        for lo in range(0, z.shape[0], self.batch_size):
            x = torch.from_numpy(np.ascontiguousarray(z[lo: lo + self.batch_size])).to(self.device, self.dtype)
            seen: list = []

            def grab(_name, t):
                self._check(t)
                seen.append(_features(t, self.site.kind, self.n) if features else None)

            with torch.no_grad(), eval_mode(self.model), capture(self.model, {self.site.canonical: self.site.point}, grab):
                if edit is None:
                    y = forward(x)
                else:
                    with intervene(self.model, self.site.point, _edit_hook(self.site.kind, self.n, edit)):
                        y = forward(x)
            if not seen:
                raise UserError(f"{self.site.canonical} ({self.site.point}) did not fire during the forward pass")
            if features:
                feats.append(seen[0])
            outs.append(self.output(y, x.shape[0]))
            user.check_output(outs[-1], "the model's output" + (" under the edit" if edit is not None else ""),
                              f"batch {lo // self.batch_size + 1} of {n_batches} (prompts {lo}..{lo + x.shape[0] - 1})")
        return np.concatenate(outs, 0), (np.concatenate(feats, 0) if features else None)


ROUNDING_ULPS = 64
"""Units of rounding (eps of the model's dtype, at the largest |entry| of the unedited output) within which
an edited output counts as unchanged (`unchanged_within_rounding`)."""


def rounding_floor(dtype, base: np.ndarray) -> float:
    """ROUNDING_ULPS * eps(dtype) * max |base|: how far two forward passes of the same prompts can differ
    with nothing changed that the output reads. The BLAS kernel, its thread count and the batch the prompts
    run in each round differently (docs/causal.md#the-rounding-floor). `dtype`: a torch dtype."""
    import torch

    eps = float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0
    return ROUNDING_ULPS * eps * float(np.max(np.abs(base), initial=0.0))


def unchanged_within_rounding(out: np.ndarray, base: np.ndarray, dtype) -> np.ndarray:
    """`out` [N, k] with each row whose change ||out - base||_2 is at most `rounding_floor(dtype, base)`
    replaced by base's row, so an edit that nothing downstream reads has effect exactly 0 on every machine."""
    same = np.linalg.norm(out - base, axis=-1) <= rounding_floor(dtype, base)
    return np.where(same[:, None], base, out)
