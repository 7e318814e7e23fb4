"""The `icrl_interp.train` package: lazy exports (every family's config class), light import, and
no family knowledge in the generic training code (it lives in the families' training modules)."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import icrl_interp
import icrl_interp.train as T
from icrl_interp.families import registry

PACKAGE = Path(icrl_interp.__file__).resolve().parent


def test_every_family_config_class_is_exported():
    from icrl_interp.train import ActorCriticTrainConfig, LinearTDTrainConfig, SarsaTrainConfig, SoftmaxTDTrainConfig

    assert ActorCriticTrainConfig().family == "actor-critic" and issubclass(ActorCriticTrainConfig, SarsaTrainConfig)
    assert LinearTDTrainConfig().family == "linear-td" and SoftmaxTDTrainConfig().family == "softmax-td"
    for family, cls in T.CONFIG_CLASSES.items():
        assert getattr(T, cls.__name__) is cls and cls.__name__ in dir(T)
    assert set(T.CONFIG_CLASSES) == set(T.training_families())


def test_unknown_names_are_attribute_errors():
    import pytest

    with pytest.raises(AttributeError):
        T.NoSuchTrainConfig  # noqa: B018
    with pytest.raises(ImportError):
        from icrl_interp.train import nothing_here  # noqa: F401


def test_importing_the_package_imports_neither_torch_nor_transformer_lens():
    code = ("import sys, icrl_interp.train as T; T.config_for; T.TrainConfig; "
            "print([m for m in ('torch', 'transformer_lens') if m in sys.modules]); "
            "T.config_for('sarsa'); T.ActorCriticTrainConfig; from icrl_interp.train import train; "
            "print([m for m in ('transformer_lens',) if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]"]


def _generic_sources():
    return sorted((PACKAGE / "train").glob("*.py")) + [PACKAGE / "commands" / "train.py"]


def _is_family(node) -> bool:
    return (isinstance(node, ast.Name) and node.id == "family") or (isinstance(node, ast.Attribute) and node.attr == "family")


def _is_literal(node) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_generic_training_code_names_no_family():
    """No family name as a string literal, and no `family == '...'` / `family in (...)` branch."""
    names = set(registry.names())
    quoted = re.compile("|".join(rf"['\"]{re.escape(n)}['\"]" for n in names))
    for path in _generic_sources():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value.strip() not in names, f"{path.name}: string literal {node.value!r}"
                assert not quoted.search(node.value), f"{path.name}: quoted family name in {node.value[:60]!r}"
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                assert not (any(map(_is_family, operands)) and any(map(_is_literal, operands))), \
                    f"{path.name}: family branch {ast.get_source_segment(text, node)!r}"
