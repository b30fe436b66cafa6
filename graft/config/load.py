"""Reading a config: YAML files with ``include``, ``key=value`` overrides, the packaged presets, saving and diffing."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from graft.config.checks import ConfigError
from graft.config.coerce import build, join_key, parse_flow_mapping, show_value
from graft.config.keys import field_hint
from graft.config.reward import success_threshold_of
from graft.config.root import Config
from graft.config.show import to_dict
from graft.config.upgrade import LEGACY_KEYS, upgrade_tree
from graft.console import say
from graft.files import write_text
from graft.registry import TASKS


def _parse_value(text: str, key: str = "") -> Any:
    """The value of a ``key=value`` override: YAML, read with the field's type in mind.

    A dict-typed field takes ``{8:0.01,12:0.9}`` without spaces (:func:`parse_flow_mapping`);
    a text field keeps the raw text when YAML would read something else (``instruction=Answer: x``
    is not a mapping, ``run_dir=2024`` is not a number).
    """
    if text == "":
        return ""
    hint = field_hint(key) if key else None
    t = text.strip()
    if hint is not None and typing.get_origin(hint) is dict and t.startswith("{") and not any(c in t[1:-1] for c in "{}[]"):
        return parse_flow_mapping(t, key)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        if hint is str:
            return text
        raise ConfigError(f"{key or 'override'}: {text!r} is not a valid value: {str(e).splitlines()[0]}") from None
    if hint is str and not isinstance(value, str):
        return text
    if hint == str | None and value is not None and not isinstance(value, (str, list)):
        return text  # an optional text (models.0.instruction=Say: x) keeps what YAML would read as a mapping
    return value


def apply_override(tree: dict, key: str, value: Any) -> None:
    """Set ``a.b.0.c = value`` in a nested dict/list tree, creating dicts as needed."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"override {key!r}: empty part in the dotted key")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not re.fullmatch(r"\d+", part):
                raise ConfigError(f"{'.'.join(parts[:i]) or key}: a list; {part!r} in override {key} is not an index")
            idx = int(part)
            if idx >= len(node):
                raise ConfigError(f"{'.'.join(parts[:i])}: override {key}: index {idx} out of range ({len(node)} items)")
            if last:
                node[idx] = value
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if part not in node or node[part] is None:
                    node[part] = {}
                node = node[part]
        else:
            raise ConfigError(f"{'.'.join(parts[:i])}: is {show_value(node)}, not a section; cannot set {key}")


def _merge(base: dict, top: dict, where: str = "") -> dict:
    """``top`` overlaid on ``base``: mappings merge key by key; a mapping of list indices merges into the list it
    overlays, entry by entry (``models: {0: {lr: 3.0e-6}}`` changes one key of the first included model); anything
    else replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _overlay(out.get(k), v, join_key(where, k))
    return out


def _overlay(base: Any, top: Any, where: str) -> Any:
    if isinstance(top, dict) and isinstance(base, dict):
        return _merge(base, top, where)
    if isinstance(top, dict) and isinstance(base, list) and top and all(type(i) is int for i in top):
        items = list(base)
        for i, v in top.items():
            if not 0 <= i < len(items):
                raise ConfigError(f"{where}.{i}: index out of range: the included {where} has {len(items)} entries")
            items[i] = _overlay(items[i], v, f"{where}.{i}")
        return items
    return top


def read_yaml_tree(path: str | Path, _seen: tuple = ()) -> dict:
    """A YAML config as a dict; ``include: other.yaml`` or ``include: [a.yaml, b.yaml]`` (relative to the file, or
    a packaged config's name: :func:`_include_path`) is read first, each file overlaid by the next and all by this
    file's keys, so presets such as configs/baselines/*.yaml stay one-liners."""
    p = Path(path)
    if p.resolve() in _seen:
        raise ConfigError(f"{p}: include cycle")
    try:
        tree = yaml.safe_load(_config_text(p)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    for notice in upgrade_tree(tree):
        say(f"{notice} ({p})")
    base: dict = {}
    for name in _includes(p, tree.pop("include", None)):
        base = _merge(base, read_yaml_tree(_include_path(p, name), (*_seen, p.resolve())))
    return _merge(base, tree)


def _include_path(p: Path, name: str) -> Path:
    """The file that config ``p``'s ``include: name`` reads: ``name`` beside ``p`` if it is there, else the packaged
    config of that name (``default`` or ``default.yaml``), so a user's own file anywhere can build on a preset."""
    beside = p.parent / name
    packaged = name.removesuffix(".yaml").removesuffix(".yml")
    if not beside.exists() and packaged in packaged_configs():
        return CONFIGS / f"{packaged}.yaml"
    return beside


def _config_text(p: Path) -> str:
    """The text of config file ``p``, or a :class:`ConfigError` saying why it cannot be read."""
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    if p.is_dir():
        hint = f" (did you mean {p / 'config.yaml'}?)" if (p / "config.yaml").is_file() else ""
        raise ConfigError(f"{p}: is a folder, not a config file{hint}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None


def _includes(p: Path, include: Any) -> list[str]:
    """The file names of config ``p``'s ``include`` key, in the order they apply."""
    names = include if isinstance(include, list) else [include] if include else []
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{p}: include: expected a file name or a list of file names, got {name!r}")
    return names


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
"""The presets shipped in the package (the repository's ``configs/`` links each of them; its experiment plans and
study record stay in the repository, beside the ``results/`` they read and write)."""


def packaged_configs() -> list[str]:
    """The names of the packaged training configs, as :func:`config_path` takes them (``default``,
    ``baselines/grpo_n16``)."""
    return sorted(p.relative_to(CONFIGS).with_suffix("").as_posix() for p in CONFIGS.rglob("*.yaml"))


def config_path(name: str | Path) -> Path:
    """The file of a config argument: a path that exists, or that ends in ``.yaml``/``.yml``, as it is; otherwise
    a packaged config's name (``default`` is ``CONFIGS/default.yaml``), from any working folder."""
    p = Path(name)
    if p.exists() or p.suffix in (".yaml", ".yml"):
        return p
    if str(name) in packaged_configs():
        return CONFIGS / f"{name}.yaml"
    raise ConfigError(
        f"config {str(name)!r}: no such file and no packaged config of that name (packaged: {', '.join(packaged_configs())})"
    )


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (a file, or a packaged config's name: :func:`config_path`) and apply ``key=value``
    overrides (values parsed as YAML); keys of earlier versions are
    translated where they are written (each file, each override, so the later still wins) with a one-line notice
    on stderr (:func:`upgrade_tree`)."""
    tree: dict = read_yaml_tree(config_path(path)) if path is not None else {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if key in LEGACY_KEYS:
            upgraded: dict = {}
            apply_override(upgraded, key, _parse_value(value, key))
            say(upgrade_tree(upgraded)[0])
            key, value = LEGACY_KEYS[key][0], yaml.safe_dump(_lookup(upgraded, LEGACY_KEYS[key][0]))
        apply_override(tree, key, _parse_value(value, key))
    return build(Config, tree, "")


def _lookup(tree: dict, key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def save_config(cfg: Config, path: str | Path, comments: Sequence[str] = ()) -> None:
    """``cfg`` as YAML at ``path``, headed by ``comments`` (``# `` lines: what the run resolved from it)."""
    head = "".join(f"# {line}\n" for line in comments)
    write_text(path, head + yaml.safe_dump(to_dict(cfg), sort_keys=False))


def config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts; lists of the same length item by item
    (``models.0.lr``). The settings of a procedural task neither config trains or evaluates on (``data.code_task.*``
    of an arithmetic run) are not compared: they change nothing the run computes, and a default moving there must
    not set a committed run apart from its plan or refuse its resume."""
    if not prefix:
        idle = [f"data.{t}." for t in TASKS if t not in _task_names(a) | _task_names(b)]
        return [k for k in config_diff(a, b, ".") if not k.startswith(tuple(idle))]
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}".lstrip(".")
        va, vb = a.get(k), b.get(k)
        if isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
            va, vb = dict(enumerate(va)), dict(enumerate(vb))
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, key + ".")
        elif va != vb:
            out.append(key)
    return out


def _task_names(tree: dict) -> set[str]:
    data = tree.get("data")
    if not isinstance(data, dict):
        return set()
    return {v for v in (data.get("train"), data.get("val")) if isinstance(v, str)}


def run_success_threshold(run_dir: str | Path) -> float:
    """``reward.success_threshold`` of the run in ``run_dir``, read off its ``config.yaml``
    (:func:`~graft.config.reward.success_threshold_of`: the default when the folder holds no readable config)."""
    try:
        tree = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        tree = None
    return success_threshold_of(tree)
