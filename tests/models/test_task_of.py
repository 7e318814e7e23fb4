"""`models.construct.task_of`: the task a model is recorded or tested on, given as a family name with its
construct options, a checkpoint directory, or a CheckpointConfig."""
from pathlib import Path

import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.families import registry
from icrl_interp.models import checkpoint
from icrl_interp.models.construct import task_config, task_of

CK = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "linear-td"


def test_a_family_a_checkpoint_and_a_config_each_give_their_task():
    assert task_of("linear-td", {"n": 5}) == task_config("linear-td", {"n": 5})
    assert task_of("linear-td", {"n": 5}).task.n == 5
    read = checkpoint.read(CK)[0]
    assert task_of(CK) == read and task_of(str(CK)) == read
    assert task_of(read) is read


@pytest.mark.parametrize("task, options, fragment", [
    ("config", {"n": 5}, "task options go with a family name, not with a checkpoint config"),
    (CK, {"n": 5}, "task options go with a family name, not with a checkpoint directory"),
    ("no-such-family", None, "task 'no-such-family' is neither a registered family ({names}) nor a checkpoint"),
    (CK / "missing", None, "nor a checkpoint directory"),
])
def test_what_is_no_task_is_refused(task, options, fragment):
    task = checkpoint.read(CK)[0] if task == "config" else task
    with pytest.raises(UserError) as e:
        task_of(task, options)
    assert fragment.format(names=", ".join(registry.names())) in str(e.value)
