"""Issue 38: a config with several mistakes reports every one of them at once, one `error: <dotted.field>: reason`
line each (exit 2): unknown keys, wrong types, bad choices and broken invariants, across sections and list items. An
invariant (`__post_init__`) of one dataclass runs only when all its fields are well typed, and every broken one of it
is reported."""
from __future__ import annotations

from pathlib import Path

import pytest

from graft.commands.cli import main
from graft.config import ConfigError, ConfigErrors, load_config

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(f"include: {REPO / 'configs' / 'default.yaml'}\n" + text)
    return p


THREE = """\
rollout: {n: lots}
checkpoint: {keep_optimizer: most}
update: {clip_low: 2}
"""


def test_three_errors_in_three_sections_are_all_reported(tmp_path, capsys):
    path = _config(tmp_path, THREE)
    assert main(["config", "show", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == [                                         # in the order of the config's sections
        "error: rollout.n: expected an integer, got 'lots'",                         # a type
        "error: update.clip_low: must be in [0, 1), got 2.0",                        # an invariant
        "error: checkpoint.keep_optimizer: 'most' is not one of all, last, none",    # a choice
    ]
    with pytest.raises(ConfigErrors) as e:
        load_config(path)
    assert [str(x) for x in e.value.errors] == [x.removeprefix("error: ") for x in errors]
    assert str(e.value) == "\n".join(str(x) for x in e.value.errors)


def test_unknown_keys_and_list_items_are_collected_too(tmp_path):
    path = _config(tmp_path, "chekpoint: {keep_last: 3}\nrollout: {n: 4, temprature: 0.7}\n")
    with pytest.raises(ConfigErrors) as e:
        load_config(path, ["models.0.lr=fast", "models.1.dtype=fp8"])
    got = [str(x).split(";")[0].split(" (")[0] for x in e.value.errors]
    assert got == ["models.0.lr: expected a number, got 'fast'",
                   "models.1.dtype: 'fp8' is not one of float32, bfloat16, float16",
                   "rollout.temprature: unknown config key",
                   "chekpoint.keep_last: unknown config key"]
    assert "did you mean checkpoint.keep_last?" in str(e.value.errors[3])


def test_an_invariant_waits_for_the_types_of_its_section_and_every_broken_one_is_reported(tmp_path):
    # models.0: lr < 0 and weight_decay < 0 are two invariants of ModelConfig: both reported, in the order checked
    with pytest.raises(ConfigErrors) as e:
        load_config(_config(tmp_path, ""), ["models.0.lr=-1", "models.0.weight_decay=-1"])
    assert [str(x).split(" (model")[0] for x in e.value.errors] == ["models.0.lr: must be >= 0, got -1.0",
                                                                    "models.0.weight_decay: must be >= 0, got -1.0"]
    # the top level's own invariants, all of them (batch_prompts breaks two: >= 1 and >= update.num_minibatches)
    with pytest.raises(ConfigErrors) as e:
        load_config(_config(tmp_path, ""), ["seed=-2", "steps=-1", "batch_prompts=0"])
    assert [str(x) for x in e.value.errors] == ["seed: must be >= 0, got -2", "steps: must be >= 0, got -1",
                                                "batch_prompts: must be >= 1, got 0",
                                                "batch_prompts: 0 must be >= update.num_minibatches (4): groups are never split"]
    # a type error in the same dataclass holds its invariants back (lr=-1 is not reported beside the bad dtype)
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, ""), ["models.0.lr=-1", "models.0.dtype=fp8"])
    assert str(e.value) == "models.0.dtype: 'fp8' is not one of float32, bfloat16, float16"
    # the top level's invariants run only once every section built: batch_prompts > num_prompts waits for rollout.n
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, ""), ["rollout.n=lots", "batch_prompts=1000"])
    assert str(e.value) == "rollout.n: expected an integer, got 'lots'"


def test_one_error_is_still_one_plain_config_error(tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, "rollout: {n: 1}\n"))
    assert type(e.value) is ConfigError and str(e.value).startswith("rollout.n: must be >= 2")
    assert main(["config", "show", str(_config(tmp_path, "rollout: {n: 1}\n"))]) == 2
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")] == [
        "error: rollout.n: must be >= 2: GRPO normalises inside a group, got 1"]


def test_a_failure_that_follows_from_a_broken_invariant_is_not_reported_in_its_place():
    from dataclasses import dataclass

    from graft.config.checks import check as _check
    from graft.config.coerce import construct as _construct

    @dataclass
    class Section:
        n: int

        def __post_init__(self) -> None:
            _check(self.n != 0, "n", "must not be 0")
            self.inverse = 1 / self.n                     # guarded by the check above: raises for n = 0

    with pytest.raises(ConfigError) as e:
        _construct(Section, {"n": 0}, "sec")
    assert type(e.value) is ConfigError and str(e.value) == "sec.n: must not be 0"   # not ZeroDivisionError
    assert _construct(Section, {"n": 4}, "sec").inverse == 0.25
    with pytest.raises(ConfigError, match="^n: must not be 0$"):
        Section(n=0)                                      # built outside the loader: the first broken one raises
