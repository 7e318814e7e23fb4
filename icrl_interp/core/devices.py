"""Where a command runs its torch work: `--device {auto,cpu,cuda}` (docs/cli.md, "Devices").

`resolve` turns the flag into a `torch.device` (`auto`: CUDA when torch sees a GPU, else the CPU;
`cuda` on a machine without one is a one-line UserError). The rest are the few helpers that code
running on a GPU needs and that are no-ops on the CPU, so the same code path runs in the CPU-only
test suite: host buffers in page-locked ("pinned") memory, from which a device-to-host copy can run
asynchronously; a wait for the device's queued work; and moving nested batches of tensors.

Building the CLI imports no torch: `Device` only declares the flag.
"""
from __future__ import annotations

import dataclasses

from .errors import UserError

CHOICES = ("auto", "cpu", "cuda")
"""Values of `--device`."""
DEFAULT = "cpu"
"""The default: results never depend on whether a GPU happens to be there."""


@dataclasses.dataclass
class Device:
    """The `--device` flag of a command (`core.cli_fields.add_fields`). Its value is checked by `resolve` (a
    one-line UserError), not by argparse, whose errors in a sub-command's sub-parser (`train FAMILY`) print
    the whole usage."""

    device: str = dataclasses.field(default=DEFAULT, metadata={"metavar": "{" + ",".join(CHOICES) + "}"})
    """Where the model's torch work runs: cpu, cuda (a GPU; an error without one) or auto (cuda when available,
    else cpu); what is drawn at random is drawn on the CPU either way (docs/cli.md, "Devices")."""


def resolve(name=DEFAULT):
    """The torch.device a `--device` value names (a torch.device or 'cuda:1' pass through, checked)."""
    import torch

    if isinstance(name, torch.device):
        text = str(name)
    elif isinstance(name, str):
        text = name.strip().lower()
    else:
        raise UserError(f"--device must be one of {', '.join(CHOICES)}, got {name!r}")
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    kind = text.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise UserError(f"--device must be one of {', '.join(CHOICES)}, got {name!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA GPU on this machine (torch "
                        f"{torch.__version__}); use --device cpu or auto")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device torch knows") from None
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def of(model):
    """The device of a module's first parameter or buffer (the CPU for a module without any)."""
    import torch

    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def pinned(device) -> bool:
    """Whether host buffers that receive copies from `device` should be pinned: only from a GPU
    (a CPU-to-CPU copy gains nothing, and pinning needs CUDA)."""
    return device.type == "cuda"


def host_empty(shape, dtype, device):
    """An uninitialized CPU tensor to copy activations of `device` into: pinned for a GPU, so that
    `copy_(t, non_blocking=True)` is an asynchronous DMA that does not stall the forward pass."""
    import torch

    return torch.empty(tuple(shape), dtype=dtype, pin_memory=pinned(device))


def synchronize(device) -> None:
    """Wait for every copy and kernel queued on `device` (a no-op on the CPU): call before a
    host buffer filled by non-blocking copies is handed to another thread."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(obj, device):
    """`obj` with every tensor in it on `device` (tensors; dicts, lists, tuples, named tuples and
    dataclasses of them, nested); anything else is returned as it is."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_device(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def deterministic_cuda() -> None:
    """cuBLAS needs a fixed workspace for `torch.use_deterministic_algorithms(True)` (else it raises);
    set it unless the user chose one. Must run before the first cuBLAS call of the process."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
