"""TRL's ``GRPOConfig`` for part (a) of ``graft bench``, matched to graft's config, and what still
differs; none of it imports TRL (:mod:`graft.bench.trl_trainer` does)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from graft.config import Config, ModelConfig

TRL_ADV_EPS = 1e-4
"""TRL's fixed epsilon in ``(r - mean) / (std + eps)``; graft's side of (a) uses it too."""

TRL_MATCHED = (
    "weights and tokenizer: the same loader (graft.policy.loading), fp32 on both sides (TRL bf16=False, fp16=False)",
    "prompts: the same arithmetic prompts in graft's template, given to TRL as text; TRL's token ids are checked "
    "against graft's (prompt_ids_match)",
    "batch: num_generations = n; per_device_train_batch_size = prompts*n/num_minibatches, steps_per_generation = "
    "update.num_minibatches, gradient_accumulation_steps = 1, so one generation batch of prompts*n completions feeds "
    "num_minibatches optimizer steps, like graft's minibatches; num_iterations = 1 (update.epochs = 1)",
    "loss: loss_type='bnpo' with gradient_accumulation_steps=1 divides the minibatch's summed token losses by its own "
    "number of completion tokens = graft's update.loss_agg=token-mean ('dapo' divides by the generation batch's "
    "token count / steps_per_generation, an average over minibatches; 'grpo' is seq-mean-token-mean)",
    "beta=0: no reference model, no KL term",
    "clip: epsilon = update.clip_low (0.2), epsilon_high = update.clip_high (0.28), importance_sampling_level="
    "'token' (update.ratio_level=token)",
    "advantages: scale_rewards='group' with Bessel's std on both sides; graft's update.adv_eps is set to TRL's 1e-4",
    "sampling: temperature and top_p of the config's rollout, top_k=0 (full vocabulary, as graft), "
    "max_completion_length = max_new_tokens, log-probs at the sampling temperature on both sides",
    "optimizer: AdamW (optim='adamw_torch') with the model's lr, betas, eps 1e-8 and weight decay, constant "
    "learning rate (lr_scheduler_type='constant', no warm-up), max_grad_norm = the model's",
    "no gradient (activation) checkpointing, no vLLM, use_cpu on CPU, disable_dropout=True, "
    "mask_truncated_completions=False (graft trains on truncated responses too)",
    "reward: graft's Grader (math_verify, same timeout and worker processes) as TRL's reward function",
)
"""TRL ``GRPOConfig`` settings of (a) and the graft settings they match."""

TRL_DIFFERENCES = (
    "old log-probs: graft uses the sampler's log-probs (update.recompute_old_logprobs=false); TRL, with "
    "steps_per_generation > gradient_accumulation_steps, runs an extra no-grad forward over all completions before "
    "the first optimizer step (counted in TRL's update_s)",
    "zero-advantage completions (all-fail or all-correct groups): graft does not forward them in the update (their "
    "gradient is exactly 0; their tokens still count in token-mean), TRL forwards every completion; graft's "
    "tokens_update says how many tokens it forwarded",
    "minibatch members: graft keeps each prompt's group whole in one minibatch, TRL shuffles the completions of the "
    "generation batch before splitting it (same sizes, different members and token counts per minibatch)",
    "sampler: graft's own KV-cache loop (each prompt prefilled once, finished rows leave the batch, per-sample seeds) "
    "vs TRL's model.generate (all prompts*n rows prefilled, finished rows padded until the longest ends); "
    "the random streams differ, so the samples and rewards differ",
    "stop strings: graft ends plain/fewshot-template responses at the template's stop string ('\\nProblem:'), "
    "TRL only at EOS (no difference for chat templates such as the default model's)",
    "log-prob kernels: graft's chunked LM head with a fused backward, TRL's fused LM head (transformers), which also "
    "computes per-token entropy for its logs",
    "bookkeeping: TRL's metric gathering, logging and callbacks are inside its step; graft's trajectory-store write "
    "after a step is outside time/step_s",
    "seeding: TRL's train() reseeds torch's global generator with the config seed on every call; graft seeds each "
    "(seed, step, model) stream",
)
"""What still differs between the two sides of (a)."""


def doc_list(title: str, items: tuple[str, ...]) -> str:
    """``items`` as a titled markdown list."""
    return f"\n{title}\n\n" + "".join(f"- {s}\n" for s in items)


__doc__ += doc_list("TRL settings matched in (a):", TRL_MATCHED) + doc_list("Differences that remain in (a):", TRL_DIFFERENCES)


class TrlUnsupported(RuntimeError):
    """The installed TRL cannot be set up to match graft (the message says why)."""


def trl_unavailable_reason() -> str | None:
    """None when TRL can be imported, else why not (one line)."""
    if importlib.util.find_spec("trl") is None:
        return "TRL is not installed (pip install 'graft[bench]')"
    try:
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (deferred: probes the optional TRL)
    except Exception as e:  # noqa: BLE001 - an incompatible TRL is reported, not raised
        return f"TRL cannot be imported: {type(e).__name__}: {e}".splitlines()[0]
    return None


def trl_batch_problem(cfg: Config) -> str | None:
    """Why TRL cannot take graft's batch as M equal minibatches of whole groups, or None."""
    M, P = cfg.update.num_minibatches, cfg.batch_prompts
    if P % M:
        return (
            f"{P} prompts do not split into update.num_minibatches={M} equal minibatches "
            "(TRL needs equal ones; choose --prompts a multiple of it)"
        )
    return None


def micro_batch_difference(cfg: Config) -> list[str]:
    """The micro-batching difference of (a), when graft splits a minibatch that TRL forwards at once."""
    rows = cfg.batch_prompts * cfg.rollout.n // cfg.update.num_minibatches
    if cfg.update.micro_batch_size >= rows:
        return []
    return [
        f"micro-batches: graft forwards each minibatch of {rows} completions in micro-batches of "
        f"update.micro_batch_size={cfg.update.micro_batch_size}, TRL all {rows} at once"
    ]


def trl_config_kwargs(cfg: Config, entry: ModelConfig, out_dir: Path, on_cpu: bool, fields: set[str]) -> dict:
    """``GRPOConfig`` keyword arguments matching graft's ``cfg`` (see :data:`TRL_MATCHED`)."""
    rc, up = cfg.rollout, cfg.update
    M = up.num_minibatches
    ckpt = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kw = dict(
        output_dir=str(out_dir),
        seed=cfg.seed,
        max_steps=M,
        report_to="none",
        save_strategy="no",
        logging_steps=10**9,
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=on_cpu,
        bf16=False,
        fp16=False,
        num_generations=rc.n,
        per_device_train_batch_size=cfg.batch_prompts * rc.n // M,
        steps_per_generation=M,
        gradient_accumulation_steps=1,
        num_iterations=up.epochs,
        max_completion_length=rc.max_new_tokens,
        temperature=rc.temperature,
        top_p=rc.top_p,
        top_k=0,
        loss_type="bnpo",
        beta=0.0,
        epsilon=up.clip_low,
        epsilon_high=up.clip_high,
        importance_sampling_level="token",
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=entry.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=entry.betas[0],
        adam_beta2=entry.betas[1],
        adam_epsilon=1e-8,
        weight_decay=entry.weight_decay,
        max_grad_norm=entry.max_grad_norm,
        use_vllm=False,
        disable_dropout=True,
        log_completions=False,
        remove_unused_columns=False,
        shuffle_dataset=True,
    )
    kw[ckpt] = False
    return kw
