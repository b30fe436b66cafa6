"""TRL's and verl's names for graft's keys: every ``GRPOConfig`` field (TRL) and dotted verl key that a user of those
trainers is likely to write, with the graft key that does the same, or ``None`` where graft has no counterpart.

One table, read twice: a config key graft does not know but one of these trainers does gets the graft key suggested
in its one-line error (:func:`other_name_hint`: ``beta: unknown config key; did you mean models.I.kl_coef? ...``),
and ``docs/configuration.md`` shows the same rows (:func:`names_table`; a test keeps the page equal to it).
A graft key ``models.I.X`` is per model (``models.0.X`` the first model's).
"""

from __future__ import annotations

import re
from typing import NamedTuple


class OtherName(NamedTuple):
    name: str
    """The other trainer's name: a ``GRPOConfig`` field (``beta``) or a dotted verl key
    (``actor_rollout_ref.actor.kl_loss_coef``)."""
    graft: str | None
    """graft's key (``models.I.X`` for a per-model one), or None: graft has no counterpart."""
    note: str = ""
    """How a value translates, or what graft does instead (one clause)."""


TRL = (
    OtherName("output_dir", "run_dir"),
    OtherName("max_steps", "steps"),
    OtherName(
        "num_train_epochs", None, "graft counts training steps: set steps; an epoch of prompts is len(data) / batch_prompts steps"
    ),
    OtherName("seed", "seed", "the same key"),
    OtherName("data_seed", None, "the prompt order follows seed"),
    OtherName("learning_rate", "models.I.lr"),
    OtherName(
        "lr_scheduler_type", "models.I.lr_schedule", "constant, linear or cosine; TRL's default is linear, graft's constant"
    ),
    OtherName("warmup_steps", "models.I.warmup_steps", "in steps; TRL's float below 1 (a share of max_steps) has none"),
    OtherName("weight_decay", "models.I.weight_decay"),
    OtherName("adam_beta1", "models.I.betas", "the first of the pair"),
    OtherName("adam_beta2", "models.I.betas", "the second of the pair"),
    OtherName("adam_epsilon", None, "torch's 1e-8, TRL's default too"),
    OtherName("optim", None, "always AdamW"),
    OtherName("max_grad_norm", "models.I.max_grad_norm"),
    OtherName(
        "per_device_train_batch_size",
        "update.micro_batch_size",
        "sequences per forward/backward; an optimizer step takes batch_prompts x rollout.n / update.num_minibatches",
    ),
    OtherName(
        "gradient_accumulation_steps",
        None,
        "graft accumulates over the micro-batches of a minibatch: (batch_prompts x rollout.n / update.num_minibatches) "
        "/ update.micro_batch_size of them",
    ),
    OtherName(
        "generation_batch_size",
        "batch_prompts",
        "graft counts prompts, TRL completions: generation_batch_size = batch_prompts x rollout.n",
    ),
    OtherName(
        "steps_per_generation",
        "update.num_minibatches",
        "optimizer steps per generation batch = steps_per_generation / gradient_accumulation_steps",
    ),
    OtherName("num_generations", "rollout.n"),
    OtherName("num_generations_eval", "eval.n"),
    OtherName("max_completion_length", "rollout.max_new_tokens"),
    OtherName(
        "max_prompt_length",
        None,
        "TRL before 0.28; graft never truncates a prompt: the longest prompt plus rollout.max_new_tokens must fit the model",
    ),
    OtherName("temperature", "rollout.temperature"),
    OtherName("top_p", "rollout.top_p"),
    OtherName("top_k", None, "graft samples from the whole vocabulary, cut by top_p only"),
    OtherName("min_p", None),
    OtherName("repetition_penalty", None),
    OtherName("generation_kwargs", None),
    OtherName("use_vllm", "rollout.engine", "use_vllm=true is rollout.engine=vllm, on the trainer's GPU"),
    OtherName("vllm_mode", None, "vLLM runs colocated on the trainer's GPU; no server mode"),
    OtherName(
        "vllm_gpu_memory_utilization",
        None,
        "the environment variable GRAFT_VLLM_GPU_MEMORY_UTILIZATION, default 0.35",
    ),
    OtherName(
        "use_transformers_paged",
        "rollout.engine",
        "rollout.engine=hf-cb: transformers' continuous batching with paged attention",
    ),
    OtherName("beta", "models.I.kl_coef", "TRL's KL estimate is k3, graft's default models.I.kl_loss_type low_var_kl"),
    OtherName("num_iterations", "update.epochs"),
    OtherName("epsilon", "update.clip_low", "TRL's epsilon is the upper bound too unless epsilon_high is set"),
    OtherName("epsilon_high", "update.clip_high", "graft's default is 0.28 (DAPO's), TRL's is epsilon"),
    OtherName("delta", None, "no upper bound on the ratio of negative-advantage tokens, INTELLECT-2's two-sided clipping"),
    OtherName("importance_sampling_level", "update.ratio_level", "token or sequence (GSPO's), the same values"),
    OtherName("reward_weights", "reward.weights"),
    OtherName(
        "multi_objective_aggregation",
        None,
        "graft sums the weighted rewards, then normalises in the group (TRL's sum_then_normalize)",
    ),
    OtherName(
        "scale_rewards",
        None,
        "graft always divides by the group's std (TRL's group); update.adv_std picks Bessel's correction, "
        "update.adv_eps the epsilon (TRL's is 1e-4)",
    ),
    OtherName(
        "loss_type",
        "update.loss_agg",
        "bnpo is token-mean (dapo too, up to its normaliser), grpo is seq-mean-token-mean; "
        "dr_grpo, cispo, sapo and the others have none",
    ),
    OtherName(
        "mask_truncated_completions",
        None,
        "graft trains on truncated responses too (their share: M/truncated_frac)",
    ),
    OtherName("sync_ref_model", None, "the KL reference is the starting weights, frozen"),
    OtherName("top_entropy_quantile", None),
    OtherName("entropy_coef", None, "no entropy bonus"),
    OtherName(
        "disable_dropout",
        None,
        "graft's models always run with dropout off",
    ),
    OtherName("remove_unused_columns", None, "every column reaches the reward functions"),
    OtherName("shuffle_dataset", "data.shuffle"),
    OtherName("model_init_kwargs", None, "models.I.dtype and models.I.revision take the usual ones"),
    OtherName("trust_remote_code", None),
    OtherName("chat_template_kwargs", None),
    OtherName("bf16", "models.I.autocast", "bf16=true is autocast=bfloat16 over fp32 weights; bf16 weights are models.I.dtype"),
    OtherName("fp16", None, "no fp16 autocast; fp16 weights are models.I.dtype=float16"),
    OtherName("gradient_checkpointing", "models.I.gradient_checkpointing", "off by default in graft, on in TRL"),
    OtherName("activation_checkpointing", "models.I.gradient_checkpointing"),
    OtherName("use_cpu", "device", "use_cpu=true is device=cpu"),
    OtherName("report_to", "logging.report_to", "tensorboard, wandb, mlflow; none is an empty list"),
    OtherName("run_name", None, "the trackers name the run after run_dir's last folder"),
    OtherName("logging_steps", None, "every step is logged (metrics.jsonl and the trackers)"),
    OtherName("log_completions", "logging.log_completions", "a count per model and step (0: none)"),
    OtherName("log_level", None, "the -v and -q flags of every graft command"),
    OtherName("disable_tqdm", "progress", "disable_tqdm=true is progress=false"),
    OtherName("save_strategy", "checkpoint.save_every", "no is save_every=0 with checkpoint.save_final=false"),
    OtherName("save_steps", "checkpoint.save_every"),
    OtherName("save_total_limit", "checkpoint.keep_last"),
    OtherName("save_only_model", "checkpoint.keep_optimizer", "save_only_model=true is keep_optimizer=none"),
    OtherName(
        "load_best_model_at_end",
        "checkpoint.keep_best",
        "keeps the best-evaluated checkpoint; graft export --step best exports it",
    ),
    OtherName("eval_strategy", "eval.every", "no is eval.every=0"),
    OtherName("eval_steps", "eval.every", "with data.val set"),
    OtherName("resume_from_checkpoint", "resume", "true: the newest intact checkpoint of run_dir; or a checkpoint's path"),
    OtherName("push_to_hub", None, "graft export writes a Hugging Face folder to upload"),
    OtherName("torch_compile", None),
)
"""TRL's ``GRPOConfig`` fields (its own and those it inherits from transformers' ``TrainingArguments``)."""

_ACTOR = "actor_rollout_ref.actor."
_ROLLOUT = "actor_rollout_ref.rollout."
_MODEL = "actor_rollout_ref.model."
_REWARD_FUNCTION = (
    "reward.function=PATH.py:NAME, path and name joined; called TRL's way, f(prompts=..., completions=..., **columns), "
    "not as verl's compute_score(data_source, solution_str, ground_truth, extra_info)"
)
VERL = (
    OtherName("data.train_files", "data.train"),
    OtherName("data.val_files", "data.val"),
    OtherName("data.train_batch_size", "batch_prompts", "prompts per step, both"),
    OtherName("data.val_max_samples", "data.val_limit", "-1 is null"),
    OtherName("data.max_prompt_length", None, "graft never truncates a prompt: it must fit with rollout.max_new_tokens"),
    OtherName("data.max_response_length", "rollout.max_new_tokens"),
    OtherName("data.prompt_key", "data.fields", "data.fields.problem=COLUMN names the prompt column"),
    OtherName("data.shuffle", "data.shuffle", "the same key"),
    OtherName(_MODEL + "path", "models.I.path"),
    OtherName(_MODEL + "tokenizer_path", "models.I.tokenizer"),
    OtherName(_MODEL + "enable_gradient_checkpointing", "models.I.gradient_checkpointing", "off by default in graft"),
    OtherName(_MODEL + "lora_rank", "models.I.lora.r", "with models.I.lora.enabled=true (verl's 0 is off)"),
    OtherName(_MODEL + "lora_alpha", "models.I.lora.alpha"),
    OtherName(_MODEL + "target_modules", "models.I.lora.target_modules", "a list of module names"),
    OtherName(_MODEL + "trust_remote_code", None),
    OtherName(_ACTOR + "optim.lr", "models.I.lr"),
    OtherName(_ACTOR + "optim.weight_decay", "models.I.weight_decay", "verl's default is 0.01, graft's 0"),
    OtherName(_ACTOR + "optim.betas", "models.I.betas"),
    OtherName(_ACTOR + "optim.lr_warmup_steps", "models.I.warmup_steps"),
    OtherName(_ACTOR + "optim.lr_warmup_steps_ratio", None, "warmup_steps = ratio x steps"),
    OtherName(_ACTOR + "optim.lr_scheduler_type", "models.I.lr_schedule", "constant or cosine (graft has linear too)"),
    OtherName(_ACTOR + "optim.warmup_style", "models.I.lr_schedule", "the older name of lr_scheduler_type"),
    OtherName(_ACTOR + "optim.min_lr_ratio", None, "the decaying schedules go to 0"),
    OtherName(_ACTOR + "optim.clip_grad", "models.I.max_grad_norm"),
    OtherName(_ACTOR + "grad_clip", "models.I.max_grad_norm"),
    OtherName(
        _ACTOR + "ppo_mini_batch_size",
        "update.num_minibatches",
        "num_minibatches = data.train_batch_size / ppo_mini_batch_size (both in prompts)",
    ),
    OtherName(_ACTOR + "ppo_micro_batch_size_per_gpu", "update.micro_batch_size", "sequences per forward/backward"),
    OtherName(_ACTOR + "ppo_epochs", "update.epochs"),
    OtherName(_ACTOR + "clip_ratio", "update.clip_low", "and update.clip_high, which graft sets apart (default 0.28)"),
    OtherName(_ACTOR + "clip_ratio_low", "update.clip_low"),
    OtherName(_ACTOR + "clip_ratio_high", "update.clip_high"),
    OtherName(_ACTOR + "clip_ratio_c", None, "no dual clip"),
    OtherName(
        _ACTOR + "loss_agg_mode",
        "update.loss_agg",
        "token-mean and seq-mean-token-mean, the same names; seq-mean-token-sum has none",
    ),
    OtherName(_ACTOR + "use_kl_loss", "models.I.kl_coef", "the KL loss is on when kl_coef > 0"),
    OtherName(_ACTOR + "kl_loss_coef", "models.I.kl_coef"),
    OtherName(_ACTOR + "kl_loss_type", "models.I.kl_loss_type", "the same names; full has none"),
    OtherName(_ACTOR + "entropy_coeff", None, "no entropy bonus"),
    OtherName(
        _ACTOR + "policy_loss.loss_mode",
        None,
        "vanilla is graft's clipped loss; GSPO's sequence ratio is update.ratio_level=sequence",
    ),
    OtherName(_ROLLOUT + "name", "rollout.engine", "vllm, or hf (graft's own sampler); sglang has none"),
    OtherName(_ROLLOUT + "n", "rollout.n"),
    OtherName(_ROLLOUT + "temperature", "rollout.temperature"),
    OtherName(_ROLLOUT + "top_p", "rollout.top_p"),
    OtherName(_ROLLOUT + "top_k", None, "graft samples from the whole vocabulary, cut by top_p only"),
    OtherName(_ROLLOUT + "response_length", "rollout.max_new_tokens"),
    OtherName(
        _ROLLOUT + "gpu_memory_utilization",
        None,
        "the environment variable GRAFT_VLLM_GPU_MEMORY_UTILIZATION, default 0.35",
    ),
    OtherName(_ROLLOUT + "val_kwargs.n", "eval.n"),
    OtherName(_ROLLOUT + "val_kwargs.temperature", "eval.temperature"),
    OtherName(_ROLLOUT + "val_kwargs.top_p", "eval.top_p"),
    OtherName("algorithm.adv_estimator", None, "graft's advantages are GRPO's"),
    OtherName(
        "algorithm.norm_adv_by_std_in_grpo",
        None,
        "graft always divides by the group's std (true); update.adv_std picks Bessel's correction",
    ),
    OtherName("algorithm.use_kl_in_reward", None, "graft's KL is a loss term: models.I.kl_coef"),
    OtherName("algorithm.kl_ctrl.kl_coef", None, "graft's KL is a loss term: models.I.kl_coef"),
    OtherName(
        "algorithm.filter_groups.enable",
        "rollout.dynamic_sampling",
        "DAPO's dynamic sampling; graft drops a group only when it carries no gradient after the exchange",
    ),
    OtherName(
        "algorithm.filter_groups.max_num_gen_batches",
        "rollout.max_rounds",
        "verl stops with an error when they run out, graft trains on the groups it kept; verl's 0 (no limit) has none",
    ),
    OtherName(
        "algorithm.filter_groups.metric",
        None,
        "graft drops a group whose advantages are all 0 after the exchange (with 0/1 rewards verl's acc)",
    ),
    OtherName("custom_reward_function.path", "reward.function", _REWARD_FUNCTION),
    OtherName("custom_reward_function.name", "reward.function", _REWARD_FUNCTION),
    OtherName("trainer.total_training_steps", "steps"),
    OtherName("trainer.total_epochs", None, "graft counts training steps: set steps"),
    OtherName("trainer.project_name", "logging.wandb_project", "and logging.mlflow_experiment"),
    OtherName("trainer.experiment_name", None, "the trackers name the run after run_dir's last folder"),
    OtherName("trainer.logger", "logging.report_to", "tensorboard, wandb, mlflow; the console line is always on"),
    OtherName("trainer.save_freq", "checkpoint.save_every", "-1 (never) is save_every=0 with checkpoint.save_final=false"),
    OtherName("trainer.test_freq", "eval.every", "with data.val set; -1 is 0"),
    OtherName("trainer.max_actor_ckpt_to_keep", "checkpoint.keep_last"),
    OtherName("trainer.default_local_dir", "run_dir"),
    OtherName("trainer.resume_mode", "resume", "auto is resume=true, disable is resume=false"),
    OtherName("trainer.resume_from_path", "resume", "resume=PATH"),
    OtherName("trainer.val_before_train", None, "graft eval --model base evaluates the starting weights"),
)
"""verl's dotted keys (``ppo_trainer.yaml``)."""

TRAINERS = {"TRL": TRL, "verl": VERL}
"""Each trainer's names, as the error messages and the documentation's tables call it."""

_BY_NAME = {n.name: (trainer, n) for trainer, names in TRAINERS.items() for n in names}


def _by_leaf() -> dict[str, tuple[str, OtherName]]:
    """Each name's last part -> its entry, for the last parts that name one graft key (or none) only."""
    seen: dict[str, list[tuple[str, OtherName]]] = {}
    for trainer, n in _BY_NAME.values():
        seen.setdefault(n.name.rsplit(".", 1)[-1], []).append((trainer, n))
    return {leaf: found[0] for leaf, found in seen.items() if len({n.graft for _, n in found}) == 1}


_BY_LEAF = _by_leaf()


def is_other_name(key: str) -> bool:
    """Whether the dotted ``key`` is, whole, one of the other trainers' names (``beta``,
    ``actor_rollout_ref.actor.kl_loss_coef``)."""
    return key in _BY_NAME


def other_name(key: str, graft_leaves: set[str]) -> tuple[str, OtherName] | None:
    """``(trainer, entry)`` of the unknown dotted ``key`` when another trainer spells a key that way: the whole key
    (:func:`is_other_name`), else its last part when that is no graft key's name (``update.kl_loss_coef``: verl's,
    misplaced); None otherwise."""
    if key in _BY_NAME:
        return _BY_NAME[key]
    leaf = key.rsplit(".", 1)[-1]
    return _BY_LEAF.get(leaf) if leaf not in graft_leaves else None


def other_name_hint(key: str, graft_leaves: set[str]) -> str | None:
    """What follows ``KEY: unknown config key; `` when another trainer names a key ``key`` (:func:`other_name`):
    the graft key to write (a per-model key with the index of ``models.N.`` in ``key``, else every model's), or
    that graft has none; None when no trainer has the name."""
    found = other_name(key, graft_leaves)
    if found is None:
        return None
    trainer, n = found
    note = f"; {n.note}" if n.note else ""
    if n.graft is None:
        return f"{trainer}'s {n.name} has no counterpart in graft" + (f" ({n.note})" if n.note else "")
    index = re.match(r"models\.(\d+)\.", key)
    if n.graft.startswith("models.I.") and index:
        return f"did you mean {n.graft.replace('.I.', f'.{index[1]}.', 1)}? ({trainer}'s {n.name}{note})"
    if n.graft.startswith("models.I."):
        rest = n.graft.removeprefix("models.I.")
        return f"did you mean {n.graft}? ({trainer}'s {n.name}, per model: models.0.{rest}, models.1.{rest}, ...{note})"
    return f"did you mean {n.graft}? ({trainer}'s {n.name}{note})"


def names_table(trainer: str) -> str:
    """The markdown table of ``trainer``'s names and graft's keys (``docs/configuration.md`` holds it)."""
    head = {"TRL": "TRL `GRPOConfig`", "verl": "verl"}[trainer]
    rows = [f"| {head} | graft | note |", "|---|---|---|"]
    for n in TRAINERS[trainer]:
        rows.append(f"| `{n.name}` | {f'`{n.graft}`' if n.graft else '—'} | {_code(n.note)} |")
    return "\n".join(rows)


def _code(note: str) -> str:
    """``note`` with its keys, values and file names as inline code (a word holding ``_``, ``=`` or a dot between
    letters: ``rollout.engine=vllm``, ``M/truncated_frac``)."""
    code = lambda m: f"`{m[0]}`" if re.search(r"[A-Za-z]", m[0]) and re.search(r"[_=]|[a-z]\.[a-zA-Z]", m[0]) else m[0]  # noqa: E731
    return re.sub(r"[\w./=-]+(?::[\w./=-]+)*", code, note)
