import pytest

from icrl_interp.families import registry
from icrl_interp.core.errors import UserError
from icrl_interp.recording.probe_spec import (
    SHIPPED,
    SPEC_DIR,
    load_spec,
    parse_spec,
    shipped_names,
    shipped_spec,
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
