"""Old import paths (the flat layout of 0.1) keep working for one release, through one table."""
from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from icrl_interp import _compat


@pytest.mark.parametrize("old, new", sorted(_compat.MOVED.items()))
def test_every_old_module_path_is_the_new_module_with_a_warning(old, new):
    target = importlib.import_module(f"icrl_interp.{new}")
    if old == new.rsplit(".", 1)[0]:  # the old flat module's name is now the package holding it
        return
    sys.modules.pop(f"icrl_interp.{old}", None)
    with pytest.warns(DeprecationWarning, match=rf"icrl_interp\.{old} moved to icrl_interp\.{new}"):
        module = importlib.import_module(f"icrl_interp.{old}")
    assert module is target  # the very module: patching either name patches both


def test_the_table_names_new_modules_that_exist_and_old_paths_that_do_not():
    root = Path(importlib.util.find_spec("icrl_interp").origin).parent
    for old, new in _compat.MOVED.items():
        assert (root / (new.replace(".", "/") + ".py")).is_file(), new
        assert not (root / (old.replace(".", "/") + ".py")).exists(), f"{old} is a module again: drop it from MOVED"


def test_from_package_import_old_name_and_attribute_access():
    import icrl_interp
    from icrl_interp.recording import recorder as new

    with pytest.warns(DeprecationWarning, match="icrl_interp.recorder moved to icrl_interp.recording.recorder"):
        old = icrl_interp.__getattr__("recorder")
    assert old is new
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        icrl_interp.__getattr__("no_such_thing")


def test_names_of_the_flat_recording_module_resolve_on_the_new_package():
    from icrl_interp.recording.format import Recording

    with pytest.warns(DeprecationWarning, match="icrl_interp.recording.format.Recording"):
        from icrl_interp.recording import Recording as old
    assert old is Recording


def test_renamed_architecture_classes_resolve_with_a_warning():
    from icrl_interp.models.masked_linear_attention import MaskedLinearAttentionModel
    from icrl_interp.models.softmax_ictd import SoftmaxICTDModel

    with pytest.warns(DeprecationWarning, match="LinearTDModel moved to icrl_interp.models.MaskedLinearAttentionModel"):
        from icrl_interp.models import LinearTDModel
    assert LinearTDModel is MaskedLinearAttentionModel
    with pytest.warns(DeprecationWarning):
        from icrl_interp.models import SoftmaxTDModel
    assert SoftmaxTDModel is SoftmaxICTDModel


def test_old_paths_work_in_a_fresh_interpreter():
    """The finder is installed by `import icrl_interp` itself: a user's script written for 0.1 runs."""
    code = ("import warnings; warnings.simplefilter('error')\n"
            "import icrl_interp\n"
            "try:\n"
            "    from icrl_interp.recorder import record_model\n"
            "except DeprecationWarning as e:\n"
            "    print('warned:', e)\n"
            "warnings.simplefilter('ignore')\n"
            "from icrl_interp.recorder import record_model\n"
            "from icrl_interp.families.sarsa_training import TRAINING\n"
            "from icrl_interp.models.linear_td import LinearTDModel\n"
            "import icrl_interp.registry as r\n"
            "print(record_model.__module__, TRAINING.__class__.__name__, LinearTDModel.__name__, r.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("warned: icrl_interp.recorder moved to icrl_interp.recording.recorder")
    assert lines[1].split() == ["icrl_interp.recording.recorder", "Recipe", "MaskedLinearAttentionModel",
                                "icrl_interp.families.registry"]


def test_an_unknown_old_looking_path_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("icrl_interp.no_such_module")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("icrl_interp.recording.recorder")  # a new path never warns
