"""Issue 22 §3: `graft config show` prints every resolved key with its value and one-line description (from the
field docstrings of graft/config.py); a misspelt key suggests the nearest valid one; an unknown command is one
line listing the commands."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from graft.cli import COMMANDS, main
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


def test_config_show_lists_every_resolved_key_with_its_description(capsys):
    assert main(["config", "show", str(REPO / "configs" / "default.yaml"), "steps=3", "models.1.lr=5e-6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cfg = load_config(REPO / "configs" / "default.yaml", ["steps=3", "models.1.lr=5e-6"])
    want = dict(_leaves(to_dict(cfg)))
    shown = {}
    for line in lines:
        kv, _, doc = line.partition("  # ")
        key, _, value = kv.partition(": ")
        shown[key] = (yaml.safe_load(value), doc.strip())
    assert set(shown) == set(want)                           # every leaf of the resolved tree, nothing else
    for key, value in want.items():
        assert shown[key][0] == value, key                   # the printed value reads back as the resolved one
        assert shown[key][1], f"{key} has no description"    # every field is documented in config.py
    assert shown["steps"] == (3, "Training steps (one rollout batch each).")
    assert shown["models.1.lr"] == (5e-6, "AdamW learning rate.")
    assert shown["checkpoint.keep_optimizer"][0] == "all"   # a default the YAML does not set


def test_descriptions_are_the_first_sentence_of_the_field_docstring():
    docs = field_docs()
    assert docs["ExchangeConfig", "delta"] == "Gate: a peer response with compatibility s <= delta is dropped (spec §3.4)."
    # "Selection size per direction: `min` keeps ... (paper); `none` ...": one sentence, RST backticks made single
    assert docs["ExchangeConfig", "balance"].startswith("Selection size per direction: `min` keeps m = min(")
    assert all("\n" not in d for d in docs.values())
    assert [k for k, _, d in describe(load_config(REPO / "configs" / "default.yaml")) if not d] == []


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
