"""`icrl-interp inspect DIR`: a checkpoint's config and parameter shapes / norms (no torch needed)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields, parsed


@dataclass
class InspectOptions:
    """What `inspect` writes besides its text."""

    json: str | None = field(default=None, metadata={"metavar": "OUT.json"})
    """Also write the config, the parameters' shapes / norms and the sha256 as one JSON object here."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint directory")
    add_fields(p, InspectOptions)


def run(args) -> int:
    import numpy as np

    from ..core.files import write_json
    from ..core.outputs import output_file
    from ..models import checkpoint

    o = parsed(args, InspectOptions)
    if o.json is not None:
        output_file(o.json, "--json", inputs=[args.checkpoint], suffixes=(".json",))
    config, tensors = checkpoint.read(args.checkpoint)
    params = {
        name: {"shape": list(t.shape), "dtype": str(t.dtype), "fro_norm": float(np.linalg.norm(t)),
               "max_abs": float(np.abs(t).max()), "nonzeros": int(np.count_nonzero(t))}
        for name, t in sorted(tensors.items())
    }
    digest = checkpoint.sha256(args.checkpoint)
    if o.json is not None:
        write_json(o.json, {"config": config.to_dict(), "parameters": params, "sha256": digest})
    raw = config.to_dict()
    layout = config.model.layout
    blocks = ", ".join(f"{name} [{a}, {b})" for name, a, b in layout.blocks)
    print(f"checkpoint {args.checkpoint}  (sha256 {digest})")
    for key, value in raw["model"].items():
        if key != "layout":
            print(f"  {'model.' + key:20s} {json.dumps(value)}")
    for key, value in raw.items():
        if key != "model":
            print(f"  {key:20s} {json.dumps(value)}")
    print(f"  {'model.layout':20s} {blocks}; readout {'-' if layout.readout_sign < 0 else ''}{layout.readout_block} "
          "of the last column")
    width = max(len(n) for n in params)
    print(f"\n  {'parameter':{width}s}  {'shape':>9s}  {'dtype':7s}  {'||.||_F':>10s}  {'max|.|':>10s}  nonzeros")
    for name, p in params.items():
        shape = "x".join(map(str, p["shape"]))
        print(f"  {name:{width}s}  {shape:>9s}  {p['dtype']:7s}  {p['fro_norm']:10.4g}  {p['max_abs']:10.4g}  {p['nonzeros']}")
    if o.json is not None:
        print(f"wrote {o.json}")
    return 0
