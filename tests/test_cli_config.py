"""Issue 38: the presets ship inside the package (`graft train default` from any folder; the repository's configs/
links to graft/configs), and one entry of an included list is changed by its index, on the command line or in the
including YAML, the rest of the entry kept."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft.config import CONFIGS, ConfigError, config_path, load_config, packaged_configs

REPO = Path(__file__).resolve().parents[1]


def _graft(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "graft.cli", *argv], capture_output=True, text=True, cwd=cwd, env=env)


def test_a_packaged_config_is_found_by_name_from_any_folder(tmp_path):
    p = _graft("config", "show", "default", "steps=3", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = {line[2:].split()[0]: (line[0], *line[2:].split()[1:3]) for line in p.stdout.splitlines()[1:]}
    assert rows["steps"] == ("*", "3", "174")                               # mark, value, default
    assert rows["models.1.path"] == ("*", "embedded:gemma3-270m", "''")
    assert _graft("config", "show", "baselines/grpo_n16", cwd=tmp_path).returncode == 0   # its include: ../default.yaml
    bad = _graft("config", "show", "defualt", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [f"error: config 'defualt': no such file and no packaged config of that name "
                                       f"(packaged: {', '.join(packaged_configs())})"]
    assert {"default", "code", "trio", "paper", "baselines/grpo_n16", "ablations/no_floor"} <= set(packaged_configs())
    assert not [n for n in packaged_configs() if n.startswith("experiments/")]   # plans, not training configs


def test_a_path_still_wins_and_the_repository_configs_are_the_packaged_ones(tmp_path, monkeypatch):
    assert (REPO / "configs" / "default.yaml").resolve() == CONFIGS / "default.yaml"   # one copy: configs/ links it
    assert config_path("configs/default.yaml") == Path("configs/default.yaml")   # a path is used as given
    assert config_path("default") == CONFIGS / "default.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").write_text("steps: 5\nmodels: [{path: m}]\nexchange: {mode: grpo}\nbatch_prompts: 8\n")
    assert config_path("default") == Path("default")                         # a file of that name in the folder wins
    with pytest.raises(ConfigError, match="^config file not found: nothere.yaml$"):
        load_config("nothere.yaml")                                         # a .yaml name is a path, as before


def test_one_field_of_an_included_list_entry_is_overridden_by_index(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(f"include: {REPO / 'configs' / 'default.yaml'}\nrun_dir: runs/child\n")
    base = load_config(REPO / "configs" / "default.yaml")
    cfg = load_config(child, ["models.0.lr=3e-6"])
    assert cfg.models[0].lr == 3e-6 and base.models[0].lr == 2e-6
    assert cfg.models[0].path == "embedded:smollm2-135m-instruct" and cfg.models[0].fewshot == 2   # the rest kept
    assert cfg.models[1] == base.models[1]


def test_the_including_yaml_changes_one_entry_by_index(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(f"include: {REPO / 'configs' / 'default.yaml'}\nmodels: {{1: {{lr: 5.0e-6, lora: {{r: 4}}}}}}\n")
    base = load_config(REPO / "configs" / "default.yaml")
    cfg = load_config(child)
    assert (cfg.models[1].lr, cfg.models[1].lora.r, cfg.models[1].lora.alpha) == (5e-6, 4, 32)
    assert (cfg.models[1].name, cfg.models[1].path, cfg.models[1].template) == ("gemma3", "embedded:gemma3-270m", "fewshot")
    assert cfg.models[0] == base.models[0] and len(cfg.models) == 2
    child.write_text(f"include: {REPO / 'configs' / 'default.yaml'}\nmodels: [{{lr: 5.0e-6}}]\n")
    with pytest.raises(ConfigError, match="^models.0.path: is required"):   # a list still replaces the included one
        load_config(child)
    child.write_text(f"include: {REPO / 'configs' / 'default.yaml'}\nmodels: {{2: {{lr: 5.0e-6}}}}\n")
    with pytest.raises(ConfigError, match=r"^models.2: index out of range: the included models has 2 entries$"):
        load_config(child)


def test_a_users_file_anywhere_includes_a_preset_by_its_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("include: default\nsteps: 3\n")
    (tmp_path / "also.yaml").write_text("include: [baselines/grpo_n16.yaml]\nrun_dir: runs/mine\n")
    assert load_config(tmp_path / "mine.yaml").steps == 3
    assert load_config(tmp_path / "also.yaml").rollout.n == 16
    (tmp_path / "mine.yaml").write_text("include: default.yaml\nsteps: 3\n")
    assert load_config(tmp_path / "mine.yaml").steps == 3                 # default.yaml: not beside it, so the preset
    (tmp_path / "default.yaml").write_text("include: ../nowhere.yaml\n")      # a file beside it wins over the preset
    with pytest.raises(ConfigError, match="^config file not found: .*nowhere.yaml$"):
        load_config(tmp_path / "mine.yaml")
