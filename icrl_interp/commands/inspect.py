"""`icrl-interp inspect DIR`: a checkpoint's config and parameter shapes / norms (no torch needed)."""
from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args) -> int:
    import numpy as np

    from ..models import checkpoint

    config, tensors = checkpoint.read(args.checkpoint)
    params = {
        name: {"shape": list(t.shape), "dtype": str(t.dtype), "fro_norm": float(np.linalg.norm(t)),
               "max_abs": float(np.abs(t).max()), "nonzeros": int(np.count_nonzero(t))}
        for name, t in sorted(tensors.items())
    }
    digest = checkpoint.sha256(args.checkpoint)
    if args.json:
        print(json.dumps({"config": config.to_dict(), "parameters": params, "sha256": digest}, indent=2))
        return 0
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
    return 0
