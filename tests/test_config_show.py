"""Issue 22 §3 and issue 38: `graft config show` prints every resolved key with its value, default, type, a mark when
the value differs from the default, and its one-line description (from the field docstrings of graft/config/); a
misspelt key suggests the nearest valid one; an unknown command is one line listing the commands."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from graft.commands.cli import COMMANDS, main
from graft.config import ConfigError, describe, field_docs, load_config, nearest_key, to_dict

REPO = Path(__file__).resolve().parents[1]


def _leaves(tree, prefix=""):
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], tree


def _table(out: str) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """``graft config show``'s header cells and, per key, (mark, value, default, type, description)."""
    head, *lines = out.splitlines()
    rows = {}
    for line in lines:
        key, value, default, kind, doc = re.split(r"\s{2,}", line[2:], maxsplit=4)
        rows[key] = (line[0], value, default, kind, doc)
    return re.split(r"\s{2,}", head.strip()), rows


def test_config_show_lists_every_resolved_key_with_default_type_and_description(capsys):
    assert main(["config", "show", str(REPO / "configs" / "default.yaml"), "steps=3", "models.1.lr=5e-6"]) == 0
    head, shown = _table(capsys.readouterr().out)
    assert head == ["key", "value", "default", "type", "description"]
    cfg = load_config(REPO / "configs" / "default.yaml", ["steps=3", "models.1.lr=5e-6"])
    want = dict(_leaves(to_dict(cfg)))
    assert set(shown) == set(want)                           # every leaf of the resolved tree, nothing else
    for key, value in want.items():
        assert yaml.safe_load(shown[key][1]) == value, key   # the printed value reads back as the resolved one
        assert shown[key][4], f"{key} has no description"    # every field is documented in graft/config/
        assert shown[key][0] == ("*" if yaml.safe_load(shown[key][2]) != value else " "), key
    # hand-worked rows: (mark, value, default, type, description)
    assert shown["steps"] == ("*", "3", "174", "an integer", "Training steps (one rollout batch each).")
    assert shown["models.1.lr"] == ("*", "5.0e-06", "1.0e-06", "a number", "AdamW learning rate.")
    assert shown["threads"][:4] == ("*", "2", "null", "an integer or null")
    assert shown["seed"][:4] == (" ", "0", "0", "an integer")                        # set in the YAML, to the default
    assert shown["rollout.n"][:3] == (" ", "8", "8")
    assert shown["checkpoint.keep_optimizer"][:4] == (" ", "all", "all", "one of all, last, none")   # not in the YAML
    assert shown["models.0.betas"][:4] == (" ", "[0.9, 0.999]", "[0.9, 0.999]", "a list of 2 numbers")
    assert shown["models.1.path"][:3] == ("*", "embedded:gemma3-270m", "''")         # ModelConfig's default


def test_descriptions_are_the_first_sentence_of_the_field_docstring():
    docs = field_docs()
    assert docs["ExchangeConfig", "delta"] == "Gate: a peer response with compatibility s <= delta is dropped (spec §3.4)."
    # "Selection size per direction: `min` keeps ... (paper); `none` ...": one sentence, RST backticks made single
    assert docs["ExchangeConfig", "balance"].startswith("Selection size per direction: `min` keeps m = min(")
    assert all("\n" not in d for d in docs.values())
    assert [s.key for s in describe(load_config(REPO / "configs" / "default.yaml")) if not s.description] == []


@pytest.mark.parametrize("override, near", [("report_to=x", "logging.report_to"), ("update.clip_hgh=0.3", "update.clip_high"),
                                            ("models.1.lrr=1e-6", "models.1.lr"),
                                            ("chekpoint.keep_last=3", "checkpoint.keep_last")])
def test_unknown_key_suggests_the_nearest(override, near, capsys):
    with pytest.raises(ConfigError, match=f"unknown config key; did you mean {near}\\?"):
        load_config(REPO / "configs" / "default.yaml", [override])
    assert main(["config", "show", str(REPO / "configs" / "default.yaml"), override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"did you mean {near}?" in err[0]
    assert nearest_key("qqqqzzzz") is None                   # nothing close: no suggestion


def test_unknown_command_is_one_line_with_the_commands():
    p = subprocess.run([sys.executable, "-m", "graft.cli", "bogus"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == f"error: unknown command 'bogus'; commands: {', '.join(COMMANDS)} (graft --help)"
    assert {"train", "eval", "probe", "config", "export"} <= set(COMMANDS)
    h = subprocess.run([sys.executable, "-m", "graft.cli", "train", "--help"], capture_output=True, text=True, cwd=REPO)
    assert h.returncode == 0 and "graft config show CONFIG" in " ".join(h.stdout.split())
