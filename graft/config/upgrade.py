"""Keys of earlier versions that still load: each is translated where it is written, with a one-line notice."""

from __future__ import annotations

from typing import Any

from graft.config.checks import ConfigError

ANSWER_FORMS = {"any": "math", "number": "number"}
"""``reward.answer_form`` of earlier versions -> the ``reward.domain`` that grades the same way."""

LEGACY_KEYS: dict[str, tuple[str, dict[Any, Any]]] = {
    "reward.answer_form": ("reward.domain", ANSWER_FORMS),
    "exchange.mode": ("exchange.kind", {"graft": "live", "grpo": "none"}),
    "peer.source": ("exchange.kind", {"live": "live", "store": "stored"}),
}
"""Keys of earlier versions that still load: ``old key -> (new key, old value -> new value)``. The exchange's keys
are read together (:func:`_upgrade_exchange_kind`); an override of one of them alone maps by this table."""


def _legacy_kind(mode: str, source: str, rule: Any) -> str:
    """The exchange kind a config of before ``exchange.kind`` ran (what ``exchange_kind`` derived): a stored peer,
    else nothing with ``mode: grpo``, else HACPO's sharing with ``update.rule: hacpo``, else GRAFT among the models."""
    derived = [(source == "store", "stored"), (mode == "grpo", "none"), (rule == "hacpo", "hacpo"), (True, "live")]
    return next(kind for hit, kind in derived if hit)


def _upgrade_exchange_kind(tree: dict) -> list[str]:
    """``exchange.mode`` / ``peer.source`` (and ``update.rule: hacpo`` without ``exchange.kind``) -> ``exchange.kind``,
    in place: the kind the config ran before the key existed. One notice, or none when there was nothing to do."""
    sections: dict[str, dict] = {}
    for name in ("exchange", "peer", "update"):
        section = tree.get(name)
        sections[name] = section if isinstance(section, dict) else {}
    old = {"exchange.mode": sections["exchange"].get("mode"), "peer.source": sections["peer"].get("source")}
    rule = sections["update"].get("rule")
    if all(v is None for v in old.values()) and (rule != "hacpo" or "kind" in sections["exchange"]):
        return []
    for key, value in old.items():
        values = LEGACY_KEYS[key][1]
        if value is not None and value not in values:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, values))}")
    for key in old:
        section, leaf = key.split(".")
        sections[section].pop(leaf, None)
    kind = _legacy_kind(old["exchange.mode"] or "graft", old["peer.source"] or "live", rule)
    given = ", ".join(f"{k}={v}" for k, v in old.items() if v is not None)
    if "kind" in sections["exchange"]:
        return [f"notice: {given} dropped: exchange.kind={sections['exchange']['kind']} names the exchange"]
    tree["exchange"] = {**sections["exchange"], "kind": kind}
    if not given:
        return [
            f"notice: update.rule=hacpo without exchange.kind is now exchange.kind={kind} (before exchange.kind, "
            "the rule chose the exchange)"
        ]
    return [f"notice: {given}{' with update.rule=hacpo' if rule == 'hacpo' else ''} is now exchange.kind={kind}"]


MATH_INSTRUCTION = "Put your final answer within \\boxed{}."
"""The instruction every model had before ``reward.domain``: in a config of that time it means ``null``."""


def upgrade_tree(tree: dict) -> list[str]:
    """Translate the keys of earlier versions (:data:`LEGACY_KEYS`; the exchange's by :func:`_upgrade_exchange_kind`)
    in a config tree, in place; returns one notice per key translated. A tree with a ``reward`` section but no
    ``reward.domain`` was written before domains (for math or number, whose instruction is the math one) and has the
    math instruction written out: it means ``null``."""
    reward = tree.get("reward")
    before_domains = isinstance(reward, dict) and "domain" not in reward  # so for math or number
    notices = _upgrade_exchange_kind(tree)
    for old, (new, values) in LEGACY_KEYS.items():
        *path, leaf = old.split(".")
        node: object = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        if value not in values:
            raise ConfigError(f"{old}: {value!r} is not one of {', '.join(map(str, values))} (now {new})")
        node.setdefault(new.rsplit(".", 1)[1], values[value])
        notices.append(f"notice: {old}={value} is now {new}={values[value]}")
    if before_domains:
        for m in tree.get("models") or []:
            if isinstance(m, dict) and m.get("instruction") == MATH_INSTRUCTION:
                m["instruction"] = None
    return notices
