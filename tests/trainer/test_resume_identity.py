"""What a resume may change, checked before any model loads (graft/trainer/resume.py): the reward's own code, the
horizon of a decaying learning-rate schedule, the run folder's history; what it accepts (timeouts, on_error, worker
counts, a new horizon set explicitly, new reward code when asked) is recorded in changes.jsonl with its step. Two
tiny models of one architecture (the cheap pair), in-process; about 90 s in all on 2 cores."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from graft.config import ConfigError
from graft.reward.functions import RewardFunctionError, code_digest
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config

pytestmark = pytest.mark.slow

REWARD = """
def score(prompts, completions, **columns):
    return [(len(c) % 3) / 2 for c in completions]
"""

VERIFY = """
def verify(response, reference):
    return (len(response) % 5) / 4, "ok"
"""

DOMAIN = """
from graft.domains import Domain

TOY = Domain(name="idtoy", verify_fn="id_verify:verify", instruction="Name a toy.",
             make_reference=lambda row: "toy:" + str(row["answer"]))
"""


def _cfg(tmp: Path, llama: str, *overrides: str):
    return tiny_config(tmp, llama, llama, "checkpoint.save_every=1", *overrides)


def _changes(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "changes.jsonl").read_text().splitlines()]


def _files(run_dir: Path) -> list:
    return sorted((str(p.relative_to(run_dir)), p.stat().st_size) for p in run_dir.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- the reward's code

@pytest.mark.parametrize("kind", ["function", "domain"])
def test_reward_code_edited_between_crash_and_resume_is_refused_unless_accepted(tmp_path, tiny_llama_dir, kind,
                                                                                monkeypatch):
    """The data was fingerprinted, the reward code was not: resume went on with other rewards, exit 0. Now the
    module file of every reward function and of a user domain (and its verify function) is part of the run."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "id_reward.py").write_text(REWARD)
    (tmp_path / "id_verify.py").write_text(VERIFY)
    (tmp_path / "id_domain.py").write_text(DOMAIN)
    edited, key = {"function": (tmp_path / "id_reward.py", f"reward.function.0 ({tmp_path / 'id_reward.py'}:score)"),
                   "domain": (tmp_path / "id_verify.py", "reward.domain.verify_fn (id_verify:verify)")}[kind]
    setting = {"function": f"reward.function=[{tmp_path / 'id_reward.py'}:score]",
               "domain": f"reward.domain={tmp_path / 'id_domain.py'}:TOY"}[kind]
    loop.train(_cfg(tmp_path, tiny_llama_dir, setting))
    run_dir = tmp_path / "run"
    edited.write_text(edited.read_text().replace("% 3) / 2", "% 3) / 4").replace("% 5) / 4", "% 5) / 8"))
    before = _files(run_dir)
    monkeypatch.setattr(loop, "make_learners", lambda *a, **k: pytest.fail("models loaded before the code check"))
    with pytest.raises(ConfigError) as e:
        loop.setup(_cfg(tmp_path, tiny_llama_dir, setting, "steps=3", "resume=true"))
    msg = str(e.value)
    assert f"the code of {key} changed since it was saved" in msg and "reward.accept_code_change=true" in msg
    assert "\n" not in msg and _files(run_dir) == before
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(tmp_path))
    loop.train(_cfg(tmp_path, tiny_llama_dir, setting, "steps=3", "resume=true", "reward.accept_code_change=true"))
    (change,) = _changes(run_dir)
    assert change["step"] == 2 and change["checkpoint"].endswith("step_000002")
    assert change["fields"] == {"steps": {"from": 2, "to": 3}, "reward.accept_code_change": {"from": False, "to": True}}
    assert list(change["reward_code"]) == [key]
    assert change["reward_code"][key]["to"] == hashlib.sha256(edited.read_bytes()).hexdigest()


def test_code_digest_of_files_modules_and_callables(tmp_path, monkeypatch):
    f = tmp_path / "r.py"
    f.write_text(REWARD)
    assert code_digest(f"{f}:score", "k") == hashlib.sha256(REWARD.encode()).hexdigest()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert code_digest("r:score", "k") == code_digest(f"{f}:score", "k")      # found without importing it
    assert code_digest("graft.reward.verifier:verify", "k") is None             # graft's own: its version says
    here = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    assert code_digest(_callable_here, "k") == here                             # a callable: its module's file
    with pytest.raises(RewardFunctionError, match=r"^reward\.function\.0: file not found: .*nope\.py$"):
        code_digest(f"{tmp_path / 'nope.py'}:score", "reward.function.0")
    with pytest.raises(RewardFunctionError, match=r"^reward\.function\.0: cannot import 'no_such_mod_xyz'"):
        code_digest("no_such_mod_xyz:score", "reward.function.0")


def _callable_here(prompts, completions, **columns):
    return [0.0] * len(completions)


def test_a_missing_reward_module_is_refused_before_models_load(tmp_path, tiny_llama_dir, monkeypatch):
    """It was found after the models loaded (12 s), leaving config.yaml behind."""
    monkeypatch.setattr(loop, "make_learners", lambda *a, **k: pytest.fail("models loaded before the reward check"))
    with pytest.raises(RewardFunctionError, match=r"^reward\.function\.0: file not found: .*gone\.py$"):
        loop.setup(_cfg(tmp_path, tiny_llama_dir, f"reward.function=[{tmp_path / 'gone.py'}:score]"))
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- the learning-rate schedule

def test_steps_changed_on_resume_keeps_or_sets_the_horizon_of_a_decaying_schedule(tmp_path, tiny_llama_dir,
                                                                                   monkeypatch):
    """Linear decay planned over 3 steps, resumed with steps=5: re-planning silently gave step 4 the rate of a
    5-step plan's step 4 after 3 steps of the 3-step plan. Now refused, unless the horizon is set: A to 5 (stretched
    from step 4 on), B to 3 (kept: 0 after it). lr 1e-3, no warm-up, p = (k - 1) / horizon:
    A: 1e-3, 1e-3 * 2/3, 1e-3 * 1/3 (horizon 3); then 1e-3 * (1 - 3/5) = 4e-4, 1e-3 * (1 - 4/5) = 2e-4 (horizon 5).
    B: the same three; then p = min(1, 3/3) = 1: 0, 0."""
    crafted_rewards(monkeypatch)
    linear = ("models.0.lr_schedule=linear", "models.1.lr_schedule=linear")
    loop.train(_cfg(tmp_path, tiny_llama_dir, "steps=3", *linear))
    with pytest.raises(ConfigError, match=r"with steps=5: models\.0\.lr_schedule=linear decays over the 3 steps the run "
                                          r"planned, so its rate from step 4 on would follow neither plan; set "
                                          r"models\.0\.lr_horizon=3 to keep the schedule or =5 to stretch it"):
        loop.setup(_cfg(tmp_path, tiny_llama_dir, "steps=5", "resume=true", *linear))
    loop.train(_cfg(tmp_path, tiny_llama_dir, "steps=5", "resume=true", *linear, "models.0.lr_horizon=5",
                    "models.1.lr_horizon=3"))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["A/learning_rate"] for r in rows] == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3, 4e-4, 2e-4], abs=1e-12)
    assert [r["B/learning_rate"] for r in rows] == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3, 0.0, 0.0], abs=1e-12)
    (change,) = _changes(tmp_path / "run")
    assert change["step"] == 3 and change["lr_horizon"] == {"A": {"from": 3, "to": 5}}
    assert change["fields"]["models.0.lr_horizon"] == {"from": None, "to": 5}
    # a constant schedule: steps may change (nothing decays), recorded
    loop.train(_cfg(tmp_path / "c", tiny_llama_dir, "steps=1"))
    loop.train(_cfg(tmp_path / "c", tiny_llama_dir, "steps=2", "resume=true"))
    assert _changes(tmp_path / "c" / "run") == [{**_changes(tmp_path / "c" / "run")[0],
                                                 "fields": {"steps": {"from": 1, "to": 2}}}]


# ----------------------------------------------------------------------------- the run folder's history

@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_llama_dir):
    """A 2-step run with a checkpoint per step, exchanges (audit.jsonl) and trajectories; tests copy it."""
    tmp = tmp_path_factory.mktemp("two_steps")
    with pytest.MonkeyPatch.context() as mp:
        crafted_rewards(mp)
        loop.train(_cfg(tmp, tiny_llama_dir))
    assert (tmp / "run" / "audit.jsonl").read_text().count("\n") >= 2
    return tmp / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize("damage,what", [
    ("metrics", "holds 0 of the 2 rows of metrics.jsonl written up to step 2"),
    ("audit", "records of audit.jsonl written up to step 2"),
    ("trajectories", "holds 1 of the 2 step files of trajectories/ written up to step 2"),
])
def test_a_run_folder_missing_its_history_is_refused_on_resume(two_steps, tmp_path, tiny_llama_dir, damage, what,
                                                               monkeypatch):
    """A deleted metrics.jsonl used to resume silently: the run's history held steps [3, 4] and summary.json said
    2 steps. Missing audit records or trajectory files went unnoticed too."""
    run = _copy(two_steps, tmp_path)
    if damage == "metrics":
        (run / "metrics.jsonl").unlink()
    elif damage == "audit":
        lines = (run / "audit.jsonl").read_text().splitlines()
        (run / "audit.jsonl").write_text(lines[0] + "\n")
    else:
        (run / "trajectories" / "step_000001.parquet").unlink()
    before = _files(run)
    monkeypatch.setattr(loop, "make_learners", lambda *a, **k: pytest.fail("models loaded before the history check"))
    with pytest.raises(ConfigError) as e:
        loop.setup(_cfg(tmp_path, tiny_llama_dir, "steps=3", "resume=true"))
    msg = str(e.value)
    assert msg.startswith(f"cannot resume from {run / 'checkpoints' / 'step_000002'}: {run} ") and what in msg, msg
    assert "resume=restart" in msg and "\n" not in msg and _files(run) == before


def test_a_folder_without_metrics_but_with_a_run_is_not_empty(two_steps, tmp_path, tiny_llama_dir, monkeypatch):
    """Only metrics.jsonl was looked at: a fresh 3-step run went ahead, leaving the old run's checkpoints and
    trajectories in place for a later resume to mix in."""
    run = _copy(two_steps, tmp_path)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"^run_dir: .* already holds a run \(audit\.jsonl, summary\.json, "
                                          r"trajectories, checkpoints\); pass resume=true"):
        loop.setup(_cfg(tmp_path, tiny_llama_dir, "steps=3"))


def test_resume_refusals_name_the_model_field_and_both_values(two_steps, tmp_path, tiny_llama_dir):
    """lr and model-path changes were refused naming only `models`."""
    run = _copy(two_steps, tmp_path)
    with pytest.raises(ConfigError, match=r"these config fields differ from the checkpoint: models\.0\.lr \(0\.001 -> "
                                          r"0\.002\), models\.1\.path \('.*' -> '/elsewhere/model'\)$"):
        loop.setup(_cfg(tmp_path, tiny_llama_dir, "resume=true", "models.0.lr=2e-3", "models.1.path=/elsewhere/model"))
    assert (run / "metrics.jsonl").is_file()


# ----------------------------------------------------------------------------- waiting and errors may change

SLOW_REWARD = """
import time

def score(prompts, completions, id, **columns):
    if any(int(i.split("-")[1]) >= 4 for i in id):    # step 2's prompts (4-7): 3 s
        time.sleep(3)
    return [(len(c) % 3) / 2 for c in completions]
"""


def test_a_run_stopped_by_a_reward_timeout_resumes_with_the_longer_timeout(tmp_path, tiny_llama_dir):
    """The fix the error suggests -- a longer reward.function_timeout_s (or on_error=zero, max_timeout_frac, the
    grader's timeout_s, worker counts) -- was refused on resume as a changed config field. Now accepted, and each
    change is written to changes.jsonl with the step it takes effect after."""
    f = tmp_path / "slow.py"
    f.write_text(SLOW_REWARD)
    base = ("steps=3", f"reward.function=[{f}:score]", "reward.workers=1")
    with pytest.raises(RewardFunctionError, match=r"took longer than reward\.function_timeout_s=1s; .*raise|"
                                                   r"took longer than reward\.function_timeout_s=1s"):
        loop.train(_cfg(tmp_path, tiny_llama_dir, *base, "reward.function_timeout_s=1"))
    run = tmp_path / "run"
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    summary = loop.train(_cfg(tmp_path, tiny_llama_dir, *base, "resume=true", "reward.function_timeout_s=10",
                              "reward.timeout_s=7", "reward.max_timeout_frac=0.9", "reward.on_error=zero",
                              "reward.workers=2"))
    assert summary["steps"] == 3
    (change,) = _changes(run)
    assert change["step"] == 1 and change["fields"] == {
        "reward.function_timeout_s": {"from": 1.0, "to": 10.0}, "reward.max_timeout_frac": {"from": 0.5, "to": 0.9},
        "reward.on_error": {"from": "stop", "to": "zero"}, "reward.timeout_s": {"from": 5.0, "to": 7.0},
        "reward.workers": {"from": 1, "to": 2}}
    statuses = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in statuses] == [1, 2, 3]
