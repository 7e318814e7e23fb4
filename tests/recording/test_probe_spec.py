import pytest

from icrl_interp.families import registry
from icrl_interp.core.errors import UserError
from icrl_interp.recording.probe_spec import (
    SHIPPED,
    SPEC_DIR,
    load_spec,
    parse_spec,
    roles_spec,
    shipped_names,
    shipped_spec,
    spec_for,
    spec_path,
)

NAMES = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post"]


def test_shipped_specs_parse():
    assert shipped_names() == registry.names() + ["generic"]  # every built-in family names a spec
    for name in shipped_names():
        spec = shipped_spec(name)
        assert spec.hooks and spec.name
        assert spec_path(name).parent == SPEC_DIR
    assert SHIPPED == {n: spec_path(n).name for n in shipped_names()}


def test_the_spec_of_a_family_is_what_its_registration_names(tmp_path):
    own = tmp_path / "mine.toml"
    own.write_text('[probe]\nname = "mine"\n[[hooks]]\npattern = "blocks.*.hook_resid_post"\n')
    base = registry.get("sarsa")
    for name, spec in (("test-spec-path", str(own)), ("test-spec-file", "linear_td.toml"), ("test-spec-none", None)):
        registry.register(registry.Family(**{**base.__dict__, "name": name, "probe_spec": spec}))
    try:
        assert shipped_spec("test-spec-path").name == "mine"
        assert shipped_spec("test-spec-file").name == "linear-td"
        assert "test-spec-none" not in shipped_names()
        with pytest.raises(UserError, match="names no probe spec"):
            shipped_spec("test-spec-none")
    finally:
        for name in ("test-spec-path", "test-spec-file", "test-spec-none"):
            registry.unregister(name)
    with pytest.raises(UserError, match="unknown family"):
        shipped_spec("no-such-family")


def test_glob_resolution_keeps_model_order_and_first_rule():
    spec = parse_spec('[[hooks]]\npattern = "blocks.*.attn.hook_pattern"\ndtype = "float16"\n'
                      '[[hooks]]\npattern = "blocks.0.*"\n')
    chosen, _ = spec.resolve(NAMES)
    assert list(chosen) == NAMES
    assert chosen["blocks.0.attn.hook_pattern"].dtype == "float16"  # first matching rule wins
    assert chosen["blocks.0.hook_resid_post"].dtype is None


@pytest.mark.parametrize("text, fragment", [
    ('[[hooks]]\npattern = "x"\ncolour = "red"\n', ":3: unknown key 'colour'"),
    ('[probe]\nname = "a"\n\n[[hooks]]\npattern = "x"\ndtype = "int8"\n', ":6: dtype 'int8'"),
    ('[[hooks]]\npattern = "x"\ncompression = "zstd"\n', ":3: compression 'zstd'"),
    ('[[hooks]]\npattern = "x"\npositions = "a:b"\n', ":3: positions 'a:b'"),
    ('[[hooks]]\npattern = "x"\n[stuff]\n', "unknown key 'stuff'"),
    ('[probe]\nname = "a"\n', "at least one [[hooks]]"),
    ('[[hooks]\n', "not valid TOML"),
    ('[[hooks]]\npattern = "x"\n\n[roles]\nresid = "layers.{layer}"\n', ":5: unknown role 'resid'"),
    ('[roles]\nresid_post = "a"\nreadout = []\n', ":3: role readout must be a module path or a list of paths"),
    ('roles = 3\n', ":1: roles must be a table [roles]"),
])
def test_bad_specs_name_the_line(text, fragment):
    with pytest.raises(UserError, match=None) as e:
        parse_spec(text, "spec.toml")
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_unmatched_patterns_are_errors_with_line():
    spec = parse_spec('[[hooks]]\npattern = "blocks.*.attn.hook_pattern"\n\n[[hooks]]\npattern = "blocks.*.mlp.hook_post"\n'
                      '[params]\nnames = ["blocks.0.attn.P"]\n', "s.toml")
    with pytest.raises(UserError, match=r"s.toml:4: hook pattern 'blocks.\*.mlp.hook_post' matches no hook"):
        spec.resolve(NAMES)
    spec = parse_spec('[[hooks]]\npattern = "blocks.0.*"\n[params]\nnames = ["blocks.0.attn.Z"]\n', "s.toml")
    with pytest.raises(UserError, match=r"s.toml:4: parameter pattern 'blocks.0.attn.Z'"):
        spec.resolve(NAMES, ["blocks.0.attn.P"])


def test_position_slice_and_axis():
    spec = parse_spec('[[hooks]]\npattern = "*"\npositions = "1:-1"\n')
    rule = spec.hooks[0]
    assert rule.position_slice() == slice(1, -1)
    assert rule.axis_for("blocks.0.attn.hook_pattern") == 2
    assert rule.axis_for("blocks.0.hook_resid_post") == 1


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read probe spec"):
        load_spec(tmp_path / "nope.toml")


def test_a_roles_dict_is_the_spec_its_roles_table_parses_to():
    """A dict of roles (`record_model(probe={...})`, the verdict's recorded roles) is built directly, equal to
    the spec file holding only that [roles] table: same roles (lists as tuples), name, JSON (resume identity)."""
    roles = {"resid_post": "layers.{layer}", "readout": ["norm", "head"], "pattern": ("layers.{layer}.attn#1",)}
    text = '[roles]\nresid_post = "layers.{layer}"\nreadout = ["norm", "head"]\npattern = ["layers.{layer}.attn#1"]\n'
    parsed = parse_spec(text, "<roles>")
    built = roles_spec(roles)
    assert built == parsed and built.to_json() == parsed.to_json()
    assert built.roles == {"resid_post": "layers.{layer}", "readout": ("norm", "head"),
                           "pattern": ("layers.{layer}.attn#1",)}
    assert spec_for(None, roles) == built  # a dict never needs the model
    # no TOML text in between: a path JSON would escape as a surrogate pair (not TOML) is kept as it is
    assert roles_spec({"resid_post": "blocks.{layer}.\U0001F600"}).roles == {"resid_post": "blocks.{layer}.\U0001F600"}


def test_the_spec_a_model_is_recorded_with(tmp_path):
    """`spec_for`: the spec given (a ProbeSpec, a file), else the model family's, else the TransformerLens
    spec for a model with TransformerLens hooks; any other module needs one."""
    from pathlib import Path

    from torch import nn

    from icrl_interp.models import checkpoint

    given = parse_spec('[[hooks]]\npattern = "x"\n')
    assert spec_for(nn.Linear(2, 2), given) is given
    path = tmp_path / "s.toml"
    path.write_text('[probe]\nname = "mine"\n[[hooks]]\npattern = "x"\n')
    assert spec_for(nn.Linear(2, 2), path) == load_spec(path)
    own = checkpoint.load(Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "sarsa")
    assert spec_for(own) == shipped_spec(own.config.family)
    hooked = nn.Sequential(nn.Linear(2, 2))
    hooked[0].hook_dict = {"hook_x": None}  # what a TransformerLens HookedRootModule carries
    assert spec_for(hooked) == shipped_spec("generic")
    with pytest.raises(UserError, match="^Linear is not a TransformerLens model: pass a probe spec"):
        spec_for(nn.Linear(2, 2))


@pytest.mark.parametrize("roles, fragment", [
    ({}, "<roles>: a spec needs at least one [[hooks]] entry or a [roles] table"),
    ({"resid": "layers.{layer}"}, "<roles>: unknown role 'resid' (roles: resid_pre, resid_post, pattern"),
    ({"resid_post": ""}, "<roles>: role resid_post must be a module path or a list of paths"),
    ({"readout": []}, "<roles>: role readout must be a module path or a list of paths"),
    ({"readout": ["norm", 3]}, "<roles>: role readout must be a module path or a list of paths"),
    ({"resid_post": {"layer": 0}}, "<roles>: role resid_post must be a module path or a list of paths"),
])
def test_a_bad_roles_dict_is_refused_by_the_spec_file_checks(roles, fragment):
    with pytest.raises(UserError) as e:
        roles_spec(roles)
    assert str(e.value).startswith(fragment)
