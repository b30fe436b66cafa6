"""Issue 10, bad input: one test per item. Each input that used to be accepted silently or to end
in a traceback is refused with a one-line message naming the field (or file), before anything is
loaded or written. The CLI side (exit code, stderr, run folder untouched) is
tests/test_cli_refusals.py."""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from graft.config import ConfigError, load_config

TWO_MODELS = "models=[{name: A, path: x}, {name: B, path: y}]"


def _load(*overrides: str, path=None):
    return load_config(path, [TWO_MODELS, *overrides])


def _refused(*overrides: str, path=None) -> str:
    with pytest.raises(ConfigError) as ei:
        _load(*overrides, path=path)
    return str(ei.value)


# ----------------------------------------------------------------------------- config values

@pytest.mark.parametrize("override, message", [
    ("exchange.mode=GRPO", "exchange.mode: 'GRPO' is not one of graft, grpo"),
    ("exchange.selection=Random", "exchange.selection: 'Random' is not one of ranked, random"),
    ("update.adv_std=Unbiased", "update.adv_std: 'Unbiased' is not one of unbiased, biased"),
    ("backend=Local", "backend: 'Local' is not one of local, ray"),
    ("exchange.balance=minimum", "exchange.balance: 'minimum' is not one of min, none, asymmetric"),
    ("models.1.template=Chat", "models.1.template: 'Chat' is not one of chat, plain, fewshot"),
    ("rollout.engine=HF", "rollout.engine: 'HF' is not one of hf, hf-bf16, hf-cb, vllm"),
    ("data.on_bad_row=true", "data.on_bad_row: true is not one of error, skip"),
])
def test_literal_fields_accept_only_their_choices(override, message):
    """issue 10: a value outside a Literal field's choices (exchange.mode=GRPO ran GRAFT,
    exchange.selection=Random ran ranked, update.adv_std=Unbiased used the biased std,
    backend=Local started Ray, exchange.balance=minimum) is refused naming the field and the choices."""
    assert _refused(override) == message


@pytest.mark.parametrize("override, message", [
    ("rollout.max_new_tokens=abc", "rollout.max_new_tokens: expected an integer, got 'abc'"),
    ("steps=abc", "steps: expected an integer, got 'abc'"),
    ("steps=2.5", "steps: expected an integer, got 2.5"),
    ("steps=true", "steps: expected an integer, got true"),
    ("models.1.lr=abc", "models.1.lr: expected a number, got 'abc'"),
    ("exchange.delta=.nan", "exchange.delta: expected a number, got nan"),
    ("progress=maybe", "progress: expected true or false, got 'maybe'"),
    ("models.0.betas=[0.9]", "models.0.betas: expected a list of 2 numbers, got 1 item(s)"),
    ("data.arithmetic.ops={a: 1}", "data.arithmetic.ops: expected a list of text, got a mapping"),
    ("logging.report_to=tb", "logging.report_to.0: 'tb' is not one of tensorboard, wandb, mlflow"),
    ("models.0.stop=[1, [2]]", "models.0.stop.1: expected text, got a list"),
    ("eval.max_new_tokens=abc", "eval.max_new_tokens: expected an integer, got 'abc'"),
    ("data.val=[a]", "data.val: expected text or an in-memory dataset (a datasets.Dataset, a pandas DataFrame or a list "
                     "of dicts) or null, got a list"),
    ("resume=null", "resume: expected text or true or false, got null"),
    ("exchange.delta_by_length={8: x}", "exchange.delta_by_length.8: expected a number, got 'x'"),
    ("ray.resources={A: {num_gpus: many}}", "ray.resources.A.num_gpus: expected a number, got 'many'"),
    ("exchange=3", "exchange: expected a mapping of ExchangeConfig fields, got 3"),
])
def test_every_field_type_is_checked_at_load(override, message):
    """issue 10: every field's type is checked at load (int, float, bool, str, optional, list,
    dict, tuple, nested dataclasses), naming the dotted field and the expected type
    (rollout.max_new_tokens=abc, steps=abc)."""
    assert _refused(override) == message


def test_numbers_are_converted_where_the_type_allows():
    """issue 10: type checking converts what is unambiguous: ints for floats, `2e-6` (a string to
    YAML 1.1) for floats, integral floats for ints, numbers for text, one item for a list."""
    cfg = _load("exchange.delta=1", "models.0.lr=2e-6", "steps=3.0", "run_dir=2024", "models.0.instruction=Say: x",
                "logging.report_to=tensorboard", "data.arithmetic.ops=+")
    assert cfg.logging.report_to == ["tensorboard"] and cfg.data.arithmetic.ops == ["+"]
    assert cfg.exchange.delta == 1.0 and isinstance(cfg.exchange.delta, float)
    assert cfg.models[0].lr == 2e-6 and cfg.steps == 3 and isinstance(cfg.steps, int)
    assert cfg.run_dir == "2024" and cfg.models[0].instruction == "Say: x"


def test_nested_list_errors_name_the_index(tmp_path):
    """issue 10: an error inside a list of dataclasses names the index (models.1.template, models.0.lora.r)."""
    f = tmp_path / "c.yaml"
    f.write_text("models:\n  - {name: A, path: x}\n  - {name: B, path: y, dtype: fp16}\n")
    with pytest.raises(ConfigError, match=r"^models\.1\.dtype: 'fp16' is not one of float32, bfloat16, float16$"):
        load_config(f)
    assert _refused("models.0.lora.r=0").startswith("models.0.lora.r: must be positive")
    assert _refused("models.1.fewshot=-1").startswith("models.1.fewshot: must be >= 0")
    assert _refused("models.0.name=a/b").startswith("models.0.name: ")


@pytest.mark.parametrize("override, message", [
    ("models.0.lr_schedule=Cosine", "models.0.lr_schedule: 'Cosine' is not one of constant, linear, cosine"),
    ("models.1.warmup_steps=-1", "models.1.warmup_steps: must be >= 0 (0: no warm-up), got -1"),
    ("models.1.warmup_steps=1.5", "models.1.warmup_steps: expected an integer, got 1.5"),
    ("models.0.kl_coef=-0.1", "models.0.kl_coef: must be a finite number >= 0 (0: no KL penalty), got -0.1 (model A)"),
    ("models.0.kl_coef=.inf", "models.0.kl_coef: must be a finite number >= 0 (0: no KL penalty), got inf (model A)"),
    ("models.1.kl_loss_type=k4",
     "models.1.kl_loss_type: 'k4' is not one of k1, kl, k2, mse, k3, low_var_kl, abs"),
    ("models.0.gradient_checkpointing=yes please", "models.0.gradient_checkpointing: expected true or false, got 'yes please'"),
])
def test_training_knobs_are_checked(override, message):
    """issue 38: a bad learning-rate schedule, warm-up, KL coefficient or estimator, or gradient-checkpointing
    switch is one line naming the field."""
    assert _refused(override) == message
    assert "\n" not in message


def test_training_knob_invariants_hold_without_the_loader():
    """issue 38: ``__post_init__`` checks the choices too (a ModelConfig built in code)."""
    from graft.config import ModelConfig
    with pytest.raises(ConfigError, match=r"^lr_schedule: 'step' is not one of constant, linear, cosine"):
        ModelConfig(name="A", path="x", lr_schedule="step")
    with pytest.raises(ConfigError, match=r"^kl_loss_type: 'k4' is not one of"):
        ModelConfig(name="A", path="x", kl_loss_type="k4")


@pytest.mark.parametrize("value", ["0", "-4"])
def test_max_new_tokens_must_be_positive(value):
    """issue 10: rollout.max_new_tokens=0 (or negative) trained on empty responses and wrote
    -Infinity into audit.jsonl; it is refused at load."""
    assert _refused(f"rollout.max_new_tokens={value}").startswith(f"rollout.max_new_tokens: must be > 0, got {value}")


@pytest.mark.parametrize("style", ["nope", "{a} {c} {b}", "{a", "What is {a}?"])
def test_arithmetic_style_is_checked_at_load(style):
    """An unknown style name, a format string with an unknown field ({c}: a KeyError traceback at data
    load before) or without both operands is refused at load naming the field."""
    assert _refused(f"data.arithmetic.style={style!r}").startswith(
        f"data.arithmetic.style: unknown arithmetic style {style!r}: use one of question, times")
    assert _load("data.arithmetic.style='Add {a} and {b}.'").data.arithmetic.style == "Add {a} and {b}."


def test_reward_workers_must_not_be_negative():
    """issue 10: reward.workers=-1 ended in a ValueError traceback from the grader after the models loaded."""
    assert _refused("reward.workers=-1").startswith("reward.workers: must be >= 0")


def test_checkpoint_keep_period_must_not_be_negative():
    assert _refused("checkpoint.keep_period=-6").startswith("checkpoint.keep_period: must be >= 0")


def test_rollout_batch_size_must_be_positive():
    """issue 10: rollout.batch_size=0 was accepted (and crashed in generation)."""
    assert _refused("rollout.batch_size=0").startswith("rollout.batch_size: must be >= 1")


def test_negative_seed_is_refused():
    """issue 10: seed=-1 with shuffling crashed in numpy's permutation (traceback)."""
    assert _refused("seed=-1", "data.shuffle=true").startswith("seed: must be >= 0")


def test_batch_prompts_larger_than_the_arithmetic_task_is_refused_at_load():
    """issue 10: batch_prompts larger than the data set ended in a ValueError traceback from the sampler."""
    msg = _refused("batch_prompts=40", "data.arithmetic.num_prompts=16", "update.num_minibatches=1")
    assert msg.startswith("batch_prompts: 40 exceeds the 16 prompts") and "data.arithmetic.num_prompts" in msg


def test_delta_by_length_without_spaces_is_accepted():
    """issue 10: exchange.delta_by_length={8:0.01,12:0.9} typed without spaces (YAML reads 8:0.01
    as one base-60 key) is parsed as the mapping it means."""
    cfg = _load("exchange.delta_by_length={8:0.01,12:0.9}")
    assert cfg.exchange.delta_by_length == {8: 0.01, 12: 0.9}
    assert _load("exchange.delta_by_length={8: 0.01, 12: 0.9}").exchange.delta_by_length == {8: 0.01, 12: 0.9}
    assert _load("exchange.delta_by_length={}").exchange.delta_by_length == {}


def test_delta_by_length_without_spaces_in_a_yaml_file_gets_a_clear_message(tmp_path):
    """issue 10: in a YAML file the no-space form cannot be recovered; the message says how to write it."""
    f = tmp_path / "c.yaml"
    f.write_text("models: [{name: A, path: x}, {name: B, path: y}]\nexchange: {delta_by_length: {8:0.01,12:0.9}}\n")
    with pytest.raises(ConfigError, match=r"^exchange\.delta_by_length: .*space after each colon"):
        load_config(f)


def test_include_may_be_a_list_applied_in_order(tmp_path):
    """issue 38: `include: [a.yaml, b.yaml]` ended in a TypeError; each file now overlays the one before it and
    the including file overlays them all."""
    (tmp_path / "a.yaml").write_text("steps: 3\nseed: 1\nmodels: [{name: A, path: x}, {name: B, path: y}]\n")
    (tmp_path / "b.yaml").write_text("steps: 4\nrollout: {n: 4}\n")
    (tmp_path / "top.yaml").write_text("include: [a.yaml, b.yaml]\nseed: 7\n")
    cfg = load_config(tmp_path / "top.yaml")
    assert (cfg.steps, cfg.seed, cfg.rollout.n, cfg.models[1].name) == (4, 7, 4, "B")


@pytest.mark.parametrize("include", ["5", "[a.yaml, {b: 1}]", "['']"])
def test_include_that_names_no_file_is_refused(tmp_path, include):
    f = tmp_path / "top.yaml"
    f.write_text(f"include: {include}\n")
    with pytest.raises(ConfigError, match=rf"^{f}: include: expected a file name or a list of file names, got "):
        load_config(f)


def test_config_that_cannot_be_read_as_text_is_refused_naming_it(tmp_path):
    """issue 38: a config that is not UTF-8 ended in a UnicodeDecodeError, a folder in "cannot write"."""
    f = tmp_path / "utf16.yaml"
    f.write_text("steps: 3\n", encoding="utf-16")
    with pytest.raises(ConfigError, match=rf"^{f}: not UTF-8 text \(byte 0xff at offset 0\); save it as UTF-8$"):
        load_config(f)
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: is a folder, not a config file$"):
        load_config(tmp_path)


def test_eval_every_without_validation_data_is_refused():
    """issue 10: eval.every set without data.val silently skipped evaluation."""
    assert _refused("eval.every=5").startswith("eval.every: is 5 but data.val is not set")
    assert _load("eval.every=5", "data.val=arithmetic").eval.every == 5


@pytest.mark.parametrize("override, field", [
    ("steps=-1", "steps"), ("batch_prompts=0", "batch_prompts"), ("threads=0", "threads"), ("device=gpu", "device"),
    ("rollout.n=1", "rollout.n"), ("rollout.top_p=0", "rollout.top_p"), ("reward.timeout_s=0", "reward.timeout_s"),
    ("exchange.delta=-1", "exchange.delta"), ("exchange.balance_floor=-1", "exchange.balance_floor"),
    ("exchange.delta_by_length={0: 0.5}", "exchange.delta_by_length.0"), ("update.clip_low=1", "update.clip_low"),
    ("update.hacpo_window=0", "update.hacpo_window"), ("checkpoint.save_every=-1", "checkpoint.save_every"),
    ("eval.n=0", "eval.n"), ("data.val_limit=0", "data.val_limit"), ("data.arithmetic.max_operand=-1", "data.arithmetic.max_operand"),
    ("peer.source=store", "peer.store_path"), ("peer.max_replacements=-2", "peer.max_replacements"),
    ("models.0.max_grad_norm=-1", "models.0.max_grad_norm"), ("models.1.betas=[0.9, 1.5]", "models.1.betas"),
    ("ray.resources={A: {num_workers: 0}}", "ray.resources.A.num_workers"), ("ray.actor_timeout_s=0", "ray.actor_timeout_s"),
    ("nope=1", "nope"), ("exchange.gate=1", "exchange.gate"), ("models.x.lr=1", "models"), ("steps.x=1", "steps"),
    ("models=[{name: A, path: x}]", "models"),
])
def test_every_config_error_names_its_dotted_field(override, field):
    """issue 10: every config error (broken invariants too) starts with the dotted field it is about."""
    assert _refused(override).startswith(f"{field}: ")


# ----------------------------------------------------------------------------- JSON outputs

def _strict(line: str):
    def bad(name):
        raise AssertionError(f"non-JSON constant {name} in {line!r}")
    return json.loads(line, parse_constant=bad)


def test_jsonl_writer_writes_no_non_finite_numbers_at_any_depth(tmp_path):
    """issue 10: -Infinity reached audit.jsonl because only top-level values were cleaned; NaN/inf
    become null at any depth (audit rows nest lists of dicts) and the file is strict JSON."""
    import numpy as np
    import torch

    from graft.files import dumps_json
    from graft.trainer.metrics import JsonlWriter

    w = JsonlWriter(tmp_path / "audit.jsonl")
    w.write({"step": 1, "m": float("nan"), "responses": [{"mean_logp_receiver": float("-inf"), "s": 0.5,
                                                          "v": [float("inf"), np.float32("nan"), torch.tensor(float("-inf"))]}]})
    rec = _strict(w.path.read_text().strip())
    assert rec == {"step": 1, "m": None, "responses": [{"mean_logp_receiver": None, "s": 0.5, "v": [None, None, None]}]}
    with pytest.raises(ValueError):   # a writer that skipped the cleaning would fail loudly
        json.dumps({"x": float("inf")}, allow_nan=False)
    assert dumps_json({"x": float("inf")}) == '{"x": null}'


# ----------------------------------------------------------------------------- run folder and disk

def test_run_dir_under_a_regular_file_is_refused_before_anything(tmp_path):
    """issue 10: a run_dir under a regular file ended in a NotADirectoryError traceback after the models loaded."""
    from graft.trainer.metrics import OutputError, check_run_dir

    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(OutputError, match=r"^run_dir .*afile/run: cannot be created because .*afile is a file"):
        check_run_dir(f / "run")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        check_run_dir(f)
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_unwritable_run_dir_is_refused(tmp_path, monkeypatch):
    """issue 10: an unwritable run_dir (no permission, read-only file system) ended in a
    PermissionError traceback after the models loaded."""
    from graft.trainer.metrics import OutputError, check_run_dir

    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))  # root ignores chmod
    with pytest.raises(OutputError, match=r"run_dir .*ro/run: cannot be created: no write permission in .*ro$"):
        check_run_dir(ro / "run")
    assert not (ro / "run").exists()


def test_disk_full_while_writing_metrics_is_an_output_error(tmp_path, monkeypatch):
    """issue 10: disk full (ENOSPC) while writing metrics was a raw OSError traceback; it is an
    OutputError naming the file (printed as one line by the CLI)."""
    from graft.trainer import metrics
    from graft.trainer.metrics import JsonlWriter, OutputError

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    w = JsonlWriter(tmp_path / "metrics.jsonl")
    monkeypatch.setattr(metrics, "open", full, raising=False)
    with pytest.raises(OutputError, match=r"cannot write .*metrics\.jsonl: No space left on device \(disk full\?\)"):
        w.write({"step": 1})


def test_disk_full_errors_are_recognised(tmp_path):
    """issue 10: disk full while writing checkpoints: the OSError, and torch's RuntimeError for a
    failed write, become one OutputError message; other errors are left alone."""
    from graft.files import output_error

    e = output_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.pt")), tmp_path)
    assert str(e) == f"cannot write {tmp_path / 'x.pt'}: No space left on device (disk full?)"
    e = output_error(RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
                                  "data/0: file write failed"), tmp_path / "checkpoints")
    assert str(e).startswith(f"cannot write {tmp_path / 'checkpoints'}: ")
    # A disk that fills in the middle of a tensor: torch sees a short write, not ENOSPC (the CI
    # failure of stop 16). The message names the free space of the folder's file system.
    e = output_error(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 33561216 vs 33561104"),
                     tmp_path / "checkpoints" / ".tmp-step_000002" / "B" / "optimizer.pt")
    assert str(e).startswith(f"cannot write {tmp_path / 'checkpoints'}")
    assert "unexpected pos" in str(e) and str(e).endswith(" MiB free; disk full?)")
    assert output_error(RuntimeError("shape mismatch"), tmp_path) is None
    assert output_error(OSError(errno.EINTR, "interrupted"), tmp_path) is None


# ----------------------------------------------------------------------------- data

def _write_jsonl(path: Path, n: int, answer_of=lambda i: str(2 * i)) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"{i} + {i}", "answer": answer_of(i)}) + "\n"
                            for i in range(n)))
    return path


def test_data_file_with_fewer_rows_than_batch_prompts_is_refused_before_models_load(tmp_path, monkeypatch):
    """issue 10: a data file with fewer rows than batch_prompts ended in a ValueError traceback
    from the sampler, after both models had loaded."""
    from graft.data.datasets import DataError
    from graft.trainer import loop

    monkeypatch.setattr(loop, "make_learners", lambda *a, **k: pytest.fail("models loaded before the data check"))
    data = _write_jsonl(tmp_path / "small.jsonl", 3)
    cfg = _load(f"data.train={data}", "batch_prompts=4", "update.num_minibatches=1", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(DataError, match=r"^batch_prompts: 4 exceeds the 3 usable prompts of data.train \(.*small\.jsonl\)"):
        loop.setup(cfg)
    assert not (tmp_path / "run").exists()


def test_prompts_fingerprint_sees_ids_problems_answers_and_order():
    """issue 10: resuming after the data file changed must be detectable: the fingerprint covers
    ids, problems, answers and their order."""
    from graft.data.datasets import prompts_fingerprint
    from graft.types import Prompt

    base = [Prompt(id="a", problem="1+1", answer="2"), Prompt(id="b", problem="2+2", answer="4")]
    fp = prompts_fingerprint(base)
    assert fp["prompts"] == 2 and len(fp["sha256"]) == 64
    assert prompts_fingerprint([Prompt(id="a", problem="1+1", answer="2"), Prompt(id="b", problem="2+2", answer="4")]) == fp
    for other in ([base[0], Prompt(id="b", problem="2+2", answer="5")], [base[0], Prompt(id="b", problem="2+3", answer="4")],
                  [base[1], base[0]], base[:1]):
        assert prompts_fingerprint(other) != fp


def test_resuming_after_the_data_file_changed_is_refused(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """issue 10: resuming after the data file changed (an answer edited: same ids) silently continued
    on the new data; with rows removed it was a ValueError traceback. The checkpoint state holds a
    fingerprint of the training data and resuming on other data is a DataError naming data.train,
    raised before any model loads."""
    from graft.data.datasets import DataError
    from graft.trainer import loop
    from tests.trainer.helpers import tiny_config

    data = _write_jsonl(tmp_path / "train.jsonl", 8)
    loop.train(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, f"data.train={data}", "steps=1"))
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    assert ckpt.is_dir()
    before = sorted((p.relative_to(tmp_path), p.stat().st_size) for p in (tmp_path / "run").rglob("*"))

    monkeypatch.setattr(loop, "make_learners", lambda *a, **k: pytest.fail("models loaded before the data check"))
    for changed in (lambda i: "7" if i == 3 else str(2 * i), None):
        if changed is None:
            _write_jsonl(data, 6)   # rows removed
        else:
            _write_jsonl(data, 8, changed)   # one answer edited
        cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, f"data.train={data}", "steps=2", "resume=true")
        with pytest.raises(DataError, match=r"^data\.train \(.*train\.jsonl\) changed since .*step_000001 was saved"):
            loop.setup(cfg)
    # a checkpoint written before the fingerprint existed: the sampler's own check of the ids, as a DataError
    from graft.trainer import resume

    real_find = resume._find_resume

    def without_fingerprint(*a):
        ck = real_find(*a)
        ck.state.pop("data_fingerprint")
        return ck

    monkeypatch.setattr(resume, "_find_resume", without_fingerprint)
    with pytest.raises(DataError, match=r"^data\.train: cannot resume from .*step_000001 with data\.train=.*different prompt set"):
        loop.setup(cfg)
    assert sorted((p.relative_to(tmp_path), p.stat().st_size) for p in (tmp_path / "run").rglob("*")) == before


# ----------------------------------------------------------------------------- store, models, eval

def test_store_info_on_a_file_says_what_it_expects_and_accepts_a_step_file(tmp_path, capsys):
    """issue 10: `graft store info FILE.parquet` said only "no trajectory store"; a step file is
    read as a one-step store, any other file gets a message saying what graft store expects."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from graft.commands.store import store_main
    from graft.storage.trajectory_store import TrajectoryStore
    from graft.types import RolloutGroup

    store = TrajectoryStore(tmp_path / "run" / "trajectories", run_id="r")
    for step in (1, 2):
        g = RolloutGroup(prompt_id=f"q{step}", problem="1+1", answer="2", source="A", holder="A", prompt_text="P",
                         prompt_token_ids=[1], responses=["2", "3"], token_ids=[[5], [6]], old_logprobs=[[-0.1], [-0.2]],
                         gen_token_ids=[[5], [6]], gen_logprobs=[[-0.1], [-0.2]], finished=[True, True],
                         rewards=[1.0, 0.0], status=["ok", "ok"], advantages=[0.7, -0.7])
        store.write_step(step, 0, [g], {"A": "tok"})
    step_file = store.path_for(2)
    assert store_main(["info", str(step_file), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["steps"] == [2, 2] and d["rows"] == 2 and d["path"] == str(step_file)

    other = tmp_path / "data.parquet"
    pq.write_table(pa.table({"x": [1]}), other)
    assert store_main(["info", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {other} is a file but not a trajectory store step file")
    assert "RUN/trajectories" in err and "step_NNNNNN.parquet" in err


def test_relative_model_path_that_does_not_exist_fails_fast(tmp_path, monkeypatch):
    """issue 10: a relative model path that does not exist (models/foo next to a models/ folder)
    was sent to the hub and failed after ~54 s of retries; a path-like value must exist locally."""
    from graft.policy import loading
    from graft.policy.loading import ModelLoadError, resolve_model_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for path, why in [("models/foo", "'models' exists here"), ("./foo", "starts with"), ("a/b/c", "more '/'"),
                      ("~/nope-graft", "starts with"), ("models/f.gguf", "'models' exists here")]:
        t0 = time.perf_counter()
        with pytest.raises(ModelLoadError, match=why):
            resolve_model_path(path)
        assert time.perf_counter() - t0 < 1.0
    monkeypatch.setattr(loading, "_HUB_STATE", {"answer": None})   # the hub "reachable": hub ids still pass
    assert resolve_model_path("owner/name") == ("owner/name", None)


def test_hub_id_fails_fast_when_offline(tmp_path, monkeypatch):
    """issue 10: with HF_HUB_OFFLINE or no network a hub id not in the local cache fails at once
    (one quick check, no retries), naming the path and the reason."""
    import socket

    from graft.policy import loading
    from graft.policy.loading import ModelLoadError, check_model_source

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "_in_hub_cache", lambda *a: False)
    with pytest.raises(ModelLoadError, match=r"'nobody/nomodel' is not a local path.*HF_HUB_OFFLINE is set"):
        check_model_source("nobody/nomodel")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(loading, "_HUB_STATE", {})
    calls = []

    def no_network(*a, **k):
        calls.append(a)
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    t0 = time.perf_counter()
    for _ in range(3):
        with pytest.raises(ModelLoadError, match=r"hub is unreachable \(cannot connect to huggingface\.co:443"):
            check_model_source("nobody/nomodel")
    assert time.perf_counter() - t0 < 5.0 and len(calls) == 1   # one check per process, no retries
    assert loading._hub_kw("main") == {"revision": "main", "local_files_only": True}


def _fake_checkpoint(run_dir: Path, step: int, names=("A", "B")) -> None:
    from graft.storage.checkpoint import save_checkpoint

    cfg = {"models": [{"name": n, "path": "x"} for n in names]}
    (run_dir).mkdir(parents=True, exist_ok=True)
    import yaml
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    save_checkpoint(run_dir, step, {n: (lambda f: (f / "config.json").write_text("{}")) for n in names}, {}, {}, cfg,
                    hash_files=False)


def test_eval_model_run_dir_suggests_folders_that_exist(tmp_path):
    """issue 10: `graft eval --model RUN_DIR` suggested RUN_DIR/A, which does not exist; it names
    the latest checkpoint's model folders, or says there is no checkpoint."""
    from graft.commands.eval_cli import _model_cfg_for
    from graft.evaluation.evaluate import EvalError

    run = tmp_path / "run"
    _fake_checkpoint(run, 2)
    _fake_checkpoint(run, 4)
    with pytest.raises(EvalError) as ei:
        _model_cfg_for(str(run), None)
    msg = str(ei.value)
    latest = run / "checkpoints" / "step_000004"
    assert msg == f"{run} is a run folder; pass one model folder of its latest checkpoint: {latest / 'A'}, {latest / 'B'}"
    assert (latest / "A").is_dir() and (latest / "B").is_dir()
    with pytest.raises(EvalError, match=r"step_000004 is a checkpoint step folder; pass one model folder: .*step_000004/A"):
        _model_cfg_for(str(latest), None)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text((run / "config.yaml").read_text())
    with pytest.raises(EvalError, match=r"empty is a run folder without a complete checkpoint"):
        _model_cfg_for(str(empty), None)
