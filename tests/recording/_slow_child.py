"""Child process for the SIGKILL tests: records slowly enough to be killed mid-run (also sharded:
tests/recording/test_shard_kills.py calls `main` in a forked child)."""
import sys
import time

import torch
from torch import nn

from icrl_interp.recording import probe_spec, recorder
from icrl_interp.models import CheckpointConfig, ModelConfig
from icrl_interp.tasks.sampling import TaskSpec


class SlowAttention(nn.Module):
    """A hand-written softmax attention layer (not a HookedRootModule)."""

    def __init__(self, D):
        super().__init__()
        self.q = nn.Linear(D, D)
        self.soft = nn.Softmax(-1)

    def forward(self, x):
        time.sleep(0.01)
        return x + self.soft(self.q(x) @ x.transpose(1, 2)) @ x


def main(out, n, resume, shards=1, workers=None):
    torch.manual_seed(0)
    model = nn.Sequential(SlowAttention(9), SlowAttention(9)).double()
    spec = probe_spec.parse_spec('[[hooks]]\npattern = "*.soft"\n[[hooks]]\npattern = "*.q"\ndtype = "bfloat16"\n')
    cfg = CheckpointConfig(model=ModelConfig(family="linear-td", d=4, n_layers=2, gamma=0.9),
                           task=TaskSpec.from_dict({"n": 12}, "linear-td", "boyan"))
    recorder.record(model, out, spec, recorder.PromptSource(config=cfg, n_total=n, seed=3), batch_size=16,
                    resume=resume, progress=False, shards=shards, workers=workers)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3)
