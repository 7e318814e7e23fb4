"""Declarative probe specs (TOML): which hooks and parameters a recording keeps.

A spec looks like

    [probe]
    name = "my-spec"
    description = "..."

    [[hooks]]
    pattern = "blocks.*.attn.hook_pattern"   # exact name or glob
    dtype = "float32"                        # stored dtype; default: the activation's own
    compression = "none"                     # none | lzf | gzip
    positions = "0:-1"                       # optional slice of the position axis

    [params]
    names = ["blocks.*.attn.P", "blocks.*.attn.Q"]

    [roles]                                  # a model of your own: its modules for the analyzers' roles
    resid_post = "layers.{layer}"            # residual stream after layer l ({layer} = 0, 1, ...)
    pattern = "layers.{layer}.attn#1"        # attention pattern [batch, (head,) query, key]
    readout = ["norm", "head"]               # residual stream -> the model's output (logit lens)

Roles are recorded under the canonical TransformerLens names (`capture.ROLES`); with roles the
`[[hooks]]` entries are optional (every role is recorded as float32). TransformerLens models need no roles.

Validation happens in two steps: `load_spec` checks the file itself (unknown keys,
bad values), `ProbeSpec.resolve` checks it against a model's hook and parameter
names (unknown names, patterns that match nothing). Errors name the spec line.

From Python a spec may also be a {role: module path} dict (`roles_spec`: the same checks, no TOML text in
between); `spec_for` picks the spec a model is recorded with when none is given.
"""
from __future__ import annotations

import fnmatch
import json
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..core import resources
from ..core.errors import UserError

SPEC_DIR = resources.probes_dir()
"""The shipped specs (top-level `probes/` of the repository; see `resources` for wheel vs checkout)."""

GENERIC = "generic"
"""`shipped_spec(GENERIC)`: the spec for TransformerLens (and other hooked) models of no registered family."""
GENERIC_SPEC = "transformer_lens.toml"

STORE_DTYPES = ("float16", "bfloat16", "float32", "float64")
COMPRESSIONS = ("none", "lzf", "gzip")
_HOOK_KEYS = {"pattern", "dtype", "compression", "positions", "pos_axis"}
_TOP_KEYS = {"probe", "hooks", "params", "roles"}
PATTERN_HOOKS = ("hook_pattern", "hook_attn_scores")
"""Hooks of attention patterns and scores, [batch, head, query, key]: `positions` slices their query axis."""
ROLE_KEYS = ("resid_pre", "resid_post", "pattern", "attn_out", "readout")
"""Keys of [roles] (capture.ROLES plus the readout)."""


@dataclass(frozen=True)
class HookRule:
    """One `[[hooks]]` entry."""

    pattern: str
    """Exact hook name or glob pattern (fnmatch) over hook names."""
    dtype: str | None = None
    """Stored dtype (float16, bfloat16, float32, float64); None keeps the activation's dtype."""
    compression: str = "none"
    """HDF5 filter. Dense float activations barely compress and filters cost 5-40x in write speed."""
    positions: str | None = None
    """Python-style slice 'start:stop[:step]' of the position axis; None keeps all positions."""
    pos_axis: int | None = None
    """Axis (counting the batch axis) that `positions` slices; default 2 for attention
    scores/patterns ([batch, head, query, key]: the query axis), else 1."""
    line: int = 0
    """Line of the spec file the rule starts on (for error messages)."""

    def position_slice(self) -> slice | None:
        if self.positions is None:
            return None
        parts = self.positions.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            sl = slice(*(int(p) if p.strip() else None for p in parts))
            if sl.step is not None and sl.step < 1:
                raise ValueError
            return sl
        except ValueError:
            raise UserError(f"line {self.line}: positions {self.positions!r} is not a slice like '0:-1' (step >= 1)") from None

    def axis_for(self, hook_name: str) -> int:
        if self.pos_axis is not None:
            return self.pos_axis
        return 2 if hook_name.endswith(PATTERN_HOOKS) else 1


@dataclass(frozen=True)
class ProbeSpec:
    """A parsed probe spec."""

    name: str
    """Short name of the spec."""
    hooks: tuple[HookRule, ...]
    """Hook rules, in file order."""
    params: tuple[str, ...] = ()
    """Parameter names or glob patterns to snapshot."""
    description: str = ""
    """Free text."""
    source: str = "<string>"
    """Where the spec came from (path), for messages."""
    param_lines: tuple[int, ...] = field(default=())
    """Spec line of each params entry."""
    roles: dict = field(default_factory=dict)
    """[roles]: role -> the model's module path template ('{layer}') or list of paths (capture.role_points)."""

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("param_lines")
        if not d["roles"]:
            d.pop("roles")  # specs without roles keep their old JSON (resume identity)
        for h in d["hooks"]:
            h.pop("line")
        return json.dumps(d, sort_keys=True)

    def pattern_rows(self, pos: int) -> int:
        """Query rows of a [pos, pos] attention pattern or score this spec records (the most over its rules;
        0: it records none): `budget`'s estimate of a recording's size."""
        rows = [len(range(pos)[r.position_slice() or slice(None)]) for r in self.hooks
                if r.pattern.partition("#")[0].endswith(PATTERN_HOOKS)]
        return max(rows, default=0)

    def full_patterns(self, hook_names=()) -> "ProbeSpec":
        """This spec with its attention patterns and scores at every query position (`record --full-patterns`):
        the `positions` of their rules dropped; a spec that records none of them gets a float32 rule for each
        of `hook_names` (the model's hooks) ending in `hook_pattern`. Each is then [heads, pos, pos], O(n²)
        per prompt; the shipped specs of the linear-attention families record O(n) per prompt instead
        (docs/formats.md, "Probe specs")."""
        attention = lambda pattern: pattern.partition("#")[0].endswith(PATTERN_HOOKS)  # noqa: E731
        rules = [replace(r, positions=None) if attention(r.pattern) and r.pos_axis is None else r for r in self.hooks]
        if not any(attention(r.pattern) for r in rules):
            rules += [HookRule(n, "float32") for n in hook_names if n.endswith("hook_pattern")]
        return replace(self, hooks=tuple(rules))

    def resolve(self, hook_names, param_names=(), role_names=()) -> tuple[dict[str, HookRule], list[str]]:
        """Match the rules against a model's names: {hook name: rule}, [param names].

        Each hook takes the first rule that matches it. A rule or params entry that
        matches nothing is an error naming its line. `role_names` are the canonical names the
        spec's roles map (capture.role_points): rules match them too, and a role no rule matches is
        recorded as float32.
        """
        role_names = list(role_names)
        hook_names = list(hook_names) + [n for n in role_names if n not in hook_names]
        chosen: dict[str, HookRule] = {}
        for rule in self.hooks:
            # 'path#k' records element k of a module's tuple output (see capture.py)
            pattern, sep, index = rule.pattern.partition("#")
            hits = [n + sep + index for n in hook_names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise UserError(f"{self.source}:{rule.line}: hook pattern {rule.pattern!r} matches no hook of the model")
            for n in hits:
                chosen.setdefault(n, rule)
        for n in role_names:
            chosen.setdefault(n, HookRule(n, "float32"))
        params: list[str] = []
        param_names = list(param_names)
        for pattern, line in zip(self.params, self.param_lines or [0] * len(self.params)):
            hits = [n for n in param_names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise UserError(f"{self.source}:{line}: parameter pattern {pattern!r} matches no parameter of the model")
            params.extend(h for h in hits if h not in params)
        ordered = {n: chosen[n] for n in sorted(chosen, key=lambda n: hook_names.index(n.partition("#")[0]))}
        return ordered, params


def _line_of(text: str, needle: str, start: int = 0) -> int:
    """1-based line of the first occurrence of needle at or after line `start`."""
    lines = text.splitlines()
    for i in range(max(start - 1, 0), len(lines)):
        if needle in lines[i]:
            return i + 1
    return 0


def parse_spec(text: str, source: str = "<string>") -> ProbeSpec:
    """Parse and validate the text of a spec."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{source}: not valid TOML: {e}") from None
    for key in data:
        if key not in _TOP_KEYS:
            raise UserError(f"{source}:{_line_of(text, key)}: unknown key {key!r} (allowed: {', '.join(sorted(_TOP_KEYS))})")
    probe = data.get("probe", {})
    if not isinstance(probe, dict) or set(probe) - {"name", "description"}:
        extra = sorted(set(probe) - {"name", "description"}) if isinstance(probe, dict) else ["probe"]
        raise UserError(f"{source}:{_line_of(text, extra[0])}: unknown key {extra[0]!r} in [probe]")
    roles = data.get("roles", {})
    if not isinstance(roles, dict):
        raise UserError(f"{source}:{_line_of(text, 'roles')}: roles must be a table [roles]")
    roles = _checked_roles(roles, lambda key: f"{source}:{_line_of(text, key)}")
    raw_hooks = data.get("hooks", [])
    if not isinstance(raw_hooks, list) or not (raw_hooks or roles):
        raise UserError(f"{source}: a spec needs at least one [[hooks]] entry or a [roles] table")
    hooks, cursor = [], 0
    for raw in raw_hooks:
        line = _line_of(text, "[[hooks]]", cursor + 1)
        cursor = line
        for key in raw:
            if key not in _HOOK_KEYS:
                raise UserError(f"{source}:{_line_of(text, key, line)}: unknown key {key!r} in [[hooks]] (allowed: {', '.join(sorted(_HOOK_KEYS))})")
        if "pattern" not in raw or not isinstance(raw["pattern"], str):
            raise UserError(f"{source}:{line}: [[hooks]] entry needs a string 'pattern'")
        dtype, comp = raw.get("dtype"), raw.get("compression", "none")
        if dtype is not None and dtype not in STORE_DTYPES:
            raise UserError(f"{source}:{_line_of(text, 'dtype', line)}: dtype {dtype!r} not one of {', '.join(STORE_DTYPES)}")
        if comp not in COMPRESSIONS:
            raise UserError(f"{source}:{_line_of(text, 'compression', line)}: compression {comp!r} not one of {', '.join(COMPRESSIONS)}")
        if any(h.pattern == raw["pattern"] for h in hooks):
            raise UserError(f"{source}:{line}: hook pattern {raw['pattern']!r} appears twice")
        rule = HookRule(raw["pattern"], dtype, comp, raw.get("positions"), raw.get("pos_axis"), line)
        try:
            rule.position_slice()
        except UserError:
            raise UserError(f"{source}:{_line_of(text, 'positions', line)}: positions {rule.positions!r} is not a slice like '0:-1'") from None
        hooks.append(rule)
    params = data.get("params", {})
    if not isinstance(params, dict) or set(params) - {"names"}:
        raise UserError(f"{source}:{_line_of(text, '[params]')}: [params] takes only 'names'")
    names = params.get("names", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError(f"{source}:{_line_of(text, 'names')}: params.names must be a list of strings")
    lines = tuple(_line_of(text, f'"{n}"') for n in names)
    return ProbeSpec(
        name=str(probe.get("name", Path(source).stem)),
        hooks=tuple(hooks),
        params=tuple(names),
        description=str(probe.get("description", "")),
        source=source,
        param_lines=lines,
        roles=roles,
    )


def _checked_roles(roles: dict, where) -> dict:
    """A [roles] table checked (role names, module paths), its lists as tuples; `where(key)` begins the
    message that names a bad entry (the spec file and line)."""
    for key, value in roles.items():
        if key not in ROLE_KEYS:
            raise UserError(f"{where(key)}: unknown role {key!r} (roles: {', '.join(ROLE_KEYS)})")
        ok = isinstance(value, str) and value or (isinstance(value, (list, tuple)) and value
                                                   and all(isinstance(v, str) and v for v in value))
        if not ok:
            raise UserError(f"{where(key)}: role {key} must be a module path or a list of paths")
    return {k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in roles.items()}


def roles_spec(roles: dict, source: str = "<roles>") -> ProbeSpec:
    """The spec of a {role: module path or list of paths} dict: what a spec file holding only that [roles]
    table parses to (`parse_spec`), built directly."""
    if not roles:
        raise UserError(f"{source}: a spec needs at least one [[hooks]] entry or a [roles] table")
    return ProbeSpec(name=Path(source).stem, hooks=(), source=source, roles=_checked_roles(dict(roles), lambda _: source))


def load_spec(path) -> ProbeSpec:
    """Read a spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read probe spec {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"probe spec {path} is not UTF-8 text (a TOML file is expected)") from None
    return parse_spec(text, str(path))


def shipped_names() -> list[str]:
    """Everything `shipped_spec` accepts: the registered families that name a probe spec, and GENERIC."""
    from ..families import registry

    return registry.where(lambda f: f.probe_spec is not None) + [GENERIC]


def spec_path(name) -> Path:
    """Where the spec of a registered family is (`registry.Family.probe_spec`: a file name in SPEC_DIR,
    or a path), or the generic spec for GENERIC; `name` may be the family's registry entry itself."""
    from ..families import registry

    entry = name if isinstance(name, registry.Family) else None
    name = name.name if entry is not None else name
    if name == GENERIC:
        return SPEC_DIR / GENERIC_SPEC
    spec = (entry or registry.get(name)).probe_spec
    if spec is None:
        raise UserError(f"family {name!r} names no probe spec; pass one with --probe (have: {', '.join(shipped_names())})")
    path = Path(spec)
    if not path.is_absolute() and ((SPEC_DIR / path).exists() or path.parent == Path(".")):
        path = SPEC_DIR / path
    return path


def shipped_spec(name) -> ProbeSpec:
    """The spec a registered model family names (`registry.Family.probe_spec`), or the generic
    TransformerLens spec for GENERIC."""
    return load_spec(spec_path(name))


def spec_for(model, probe=None, full_patterns: bool = False) -> ProbeSpec:
    """The probe spec to record `model` (a torch module) with: the one given (a path, a ProbeSpec, or a
    {role: path} dict: `roles_spec`), else the model family's shipped spec, else the TransformerLens spec
    for a TransformerLens model; with `full_patterns`, its patterns and scores at every query position
    (`ProbeSpec.full_patterns`, `record --full-patterns`)."""
    if full_patterns:
        from .capture import hook_names

        return spec_for(model, probe).full_patterns(hook_names(model))
    from ..models.config import ModelConfig

    if isinstance(probe, ProbeSpec):
        return probe
    if isinstance(probe, dict):
        return roles_spec(probe)
    if probe is not None:
        return load_spec(probe)
    own = getattr(model, "config", None)
    if isinstance(own, ModelConfig):
        return shipped_spec(own.family_entry)
    if any(getattr(m, "hook_dict", None) for m in model.modules()):
        return shipped_spec(GENERIC)
    raise UserError(f"{type(model).__name__} is not a TransformerLens model: pass a probe spec whose [roles] map the "
                    f"residual stream, attention pattern and readout to its modules (docs/byom.md)")


def __getattr__(name: str):
    # `SHIPPED` ({name: spec file name}) is derived from the registry on access, for older callers;
    # prefer shipped_names() and spec_path().
    if name == "SHIPPED":
        return {n: spec_path(n).name for n in shipped_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
