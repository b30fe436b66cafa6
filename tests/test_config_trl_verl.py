"""TRL's and verl's names: the tables of docs/configuration.md are graft/config/trl_verl.py's, and every name in them,
written as a config key, stops with one line naming the graft key the table gives (or saying there is none)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from graft.cli import main
from graft.config import ConfigError, ConfigErrors, field_hint, load_config
from graft.config.keys import key_templates
from graft.config.trl_verl import TRAINERS, names_table

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "configuration.md").read_text()
ROW = re.compile(r"^\| `([^`]+)` \| (?:`([^`]+)`|—) \|", re.M)


def _doc_rows() -> list[tuple[str, str, str | None]]:
    """(trainer, name, graft key or None) of every row of the two tables of docs/configuration.md."""
    rows = []
    for trainer, head in (("TRL", "| TRL `GRPOConfig` |"), ("verl", "| verl |")):
        table = DOC[DOC.index(head):].split("\n\n")[0]
        rows += [(trainer, name, graft or None) for name, graft in ROW.findall(table)]
    return rows


ROWS = _doc_rows()
NEW_KEY = [r for r in ROWS if r[2] != r[1]]


def test_the_documented_tables_are_the_code_s():
    for trainer in TRAINERS:
        assert names_table(trainer) in DOC, f"docs/configuration.md: paste graft.config.trl_verl.names_table({trainer!r})"
    assert len(ROWS) == sum(len(names) for names in TRAINERS.values()) > 100
    assert {"beta", "num_generations", "max_completion_length", "learning_rate", "epsilon_high", "loss_type",
            "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.rollout.n", "data.train_batch_size",
            "trainer.total_training_steps"} <= {name for _, name, _ in ROWS}


def test_every_graft_key_of_the_tables_is_a_key_of_the_config_tree():
    templates = set(key_templates())
    for _, name, graft in ROWS:
        assert graft is None or graft.replace(".I.", ".*.") in templates, (name, graft)
    assert [name for _, name, graft in ROWS if graft == name] == ["seed", "data.shuffle"]
    assert all(field_hint(name) is not None for _, name, graft in ROWS if graft == name)   # the same key: accepted


def test_a_name_said_to_have_no_counterpart_is_no_graft_key_s_name():
    """Catches a counterpart added later (a ``rollout.top_k``) while the table still says there is none."""
    leaves = {t.rsplit(".", 1)[-1] for t in key_templates()}
    lonely = [name for _, name, graft in ROWS if graft is None and name.rsplit(".", 1)[-1] in leaves]
    assert lonely == ["delta", "algorithm.kl_ctrl.kl_coef"]   # other meanings: graft's gate, graft's loss-term KL


def test_a_name_without_counterpart_that_is_a_graft_name_too_says_both():
    with pytest.raises(ConfigError, match=r"^delta: unknown config key; TRL's delta has no counterpart in graft \(.*\); "
                                          r"graft's own delta is exchange.delta$"):
        load_config(None, ["delta=0.5"])


def _expect(message: str, trainer: str, name: str, graft: str | None) -> None:
    assert "\n" not in message
    head = f"{name}: unknown config key; "
    assert message.startswith(head), message
    if graft is None:
        assert message.startswith(f"{head}{trainer}'s {name} has no counterpart in graft"), message
    elif graft.startswith("models.I."):
        rest = graft.removeprefix("models.I.")
        assert message.startswith(f"{head}did you mean {graft}? ({trainer}'s {name}, per model: models.0.{rest}, "), message
    else:
        assert message.startswith(f"{head}did you mean {graft}? ({trainer}'s {name}"), message


@pytest.mark.parametrize("trainer, name, graft", NEW_KEY, ids=[r[1] for r in NEW_KEY])
def test_each_name_gets_its_graft_key_from_an_override(trainer, name, graft):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{name}=1"])
    assert not isinstance(e.value, ConfigErrors)
    _expect(str(e.value), trainer, name, graft)


def _nested(dotted: str, value) -> dict:
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


@pytest.mark.parametrize("trainer, name, graft", NEW_KEY, ids=[r[1] for r in NEW_KEY])
def test_each_name_gets_its_graft_key_from_a_yaml_file(trainer, name, graft, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_nested(name, 1)))   # verl's dotted keys as nested sections
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert not isinstance(e.value, ConfigErrors)
    _expect(str(e.value), trainer, name, graft)


def test_the_cli_says_it_in_one_line(capsys):
    assert main(["config", "show", "default", "beta=0.04"]) == 2
    assert capsys.readouterr().err == (
        "error: beta: unknown config key; did you mean models.I.kl_coef? (TRL's beta, per model: models.0.kl_coef, "
        "models.1.kl_coef, ...; TRL's KL estimate is k3, graft's default models.I.kl_loss_type low_var_kl)\n")


def test_a_verl_section_pasted_whole_gets_a_line_per_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("include: default\n"
                    "actor_rollout_ref:\n"
                    "  actor: {kl_loss_coef: 0.01, clip_ratio_high: 0.28, tensor_model_parallel_size: 2}\n"
                    "  rollout: {n: 8}\n"
                    "trainer: {total_training_steps: 10}\n")
    with pytest.raises(ConfigErrors) as e:
        load_config(path)
    assert [str(x).split("?")[0] for x in e.value.errors] == [
        "actor_rollout_ref.actor.kl_loss_coef: unknown config key; did you mean models.I.kl_coef",
        "actor_rollout_ref.actor.clip_ratio_high: unknown config key; did you mean update.clip_high",
        "actor_rollout_ref.actor.tensor_model_parallel_size: unknown config key",   # none of graft's, nothing near
        "actor_rollout_ref.rollout.n: unknown config key; did you mean rollout.n",
        "trainer.total_training_steps: unknown config key; did you mean steps",
    ]


@pytest.mark.parametrize("override, line", [
    # a model's own key, TRL-named: the model's index kept
    ("models.1.learning_rate=2e-6", "models.1.learning_rate: unknown config key; did you mean models.1.lr? "
                                    "(TRL's learning_rate)"),
    # verl's leaf name in graft's section: found by its last part
    ("update.clip_ratio_high=0.3", "update.clip_ratio_high: unknown config key; did you mean update.clip_high? "
                                   "(verl's actor_rollout_ref.actor.clip_ratio_high)"),
    # a misspelling of graft's own key still gets the nearest key, not another trainer's
    ("update.clip_hgh=0.3", "update.clip_hgh: unknown config key; did you mean update.clip_high? (the keys of update"),
])
def test_names_in_graft_s_sections(override, line, tiny_models_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(tiny_models_yaml, [override])
    assert str(e.value).startswith(line), str(e.value)


@pytest.fixture
def tiny_models_yaml(tmp_path) -> Path:
    path = tmp_path / "two.yaml"
    path.write_text("models: [{name: A, path: a}, {name: B, path: b}]\n")
    return path
