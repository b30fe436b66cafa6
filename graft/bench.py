"""``graft bench``: graft's own steps timed against references, side by side in one process.

    graft bench [--only a,b,c] [--reps 3] [--model PATH] [--models P1,P2] [--config CFG]
                [--prompts 4] [--n 8] [--max-new-tokens 48] [--threads T] [--device auto]
                [--out DIR] [--keep-balance] [--max-tries 4] [key=value ...]

Each part alternates its two sides, repetition by repetition (A, B, A, B, ...), so that a
machine that gets slower or faster during the run affects both alike; it reports the median
of every number and keeps every raw value.

(a) **graft GRPO step vs TRL ``GRPOTrainer``** on one model (``--model``, default
    ``embedded:smollm2-135m-instruct``; any HF folder, hub id or GGUF). graft's side is
    :func:`graft.trainer.loop.train_step` on a :class:`~graft.trainer.loop.Run` built by
    :func:`graft.trainer.loop.setup` (one model, ``exchange.mode=grpo``), i.e. exactly what
    ``graft train`` runs: rollout, scoring with graft's grader and GRPO advantages, the update
    over ``update.num_minibatches`` minibatches planned by
    :func:`graft.algos.minibatch.plan_minibatches`. Every repetition uses the same prompts
    (the sampler is rewound). TRL's side is one generation batch of the same prompts (same
    text, same token ids: checked) trained for ``num_minibatches`` optimizer steps, i.e. one
    ``trainer.train()`` call with ``max_steps = num_minibatches``; its step time runs from the
    first optimizer step's ``on_step_begin`` to the last one's ``on_step_end`` (the call's
    own set-up is reported apart as ``train_call_s``). TRL's split: ``rollout_s`` is
    ``GRPOTrainer._generate``, ``score_s`` is ``_calculate_rewards`` (graft's grader), and
    ``update_s`` is the rest, including TRL's no-grad forward for the old log-probs. The
    settings matched and the differences that remain are :data:`TRL_MATCHED` and
    :data:`TRL_DIFFERENCES` (listed at the end of this docstring and in ``bench.md``).
    TRL is optional (``pip install 'graft[bench]'``); without it (a) times graft alone.
(b) **graft's rollout vs plain ``model.generate``** (transformers, ``do_sample``) for each
    model of ``--models`` (default: the config's models, i.e. both embedded models): the same
    prompts in the same template, ``n`` samples each, ``max_new_tokens``, temperature, top-p,
    no top-k, the same stop tokens (and stop strings) and ``rollout.batch_size`` sequences per
    call, on the same loaded model. Tokens counted up to and including the stop token. A third
    side samples with ``rollout.engine=hf-bf16`` and then recomputes the behaviour log-probs
    with the fp32 forward (what that engine requires); both times and the log-prob gap are reported.
(c) **GRAFT step vs GRPO step on the pair** (``--config``, default ``configs/default.yaml``,
    with ``key=value`` overrides) on one Run, switching ``exchange.mode`` between repetitions.
    A GRAFT repetition only counts when peer groups are handed over
    (``exchange/*/transferred > 0``): it runs up to ``--max-tries`` steps on fresh prompts
    until one does; the GRPO repetition then runs on the prompts of that step. By default
    (c) sets ``exchange.balance=none`` (the no-balancing ablation), because with the paper's
    balancing a direction without a partner candidate transfers nothing (``m = 0``; see the
    README); ``--keep-balance`` keeps the config's balancing and relies on retries alone.
    The JSON says which (``exchange_ensured_by``) and the exchange's share of the step,
    ``time/exchange_s / time/step_s``.
(d) **peak RSS** of this process (``ru_maxrss``), per repetition side: the kernel's peak
    counter is reset before each side runs (``/proc/self/clear_refs``, Linux); where that is
    not possible the value is the process peak so far (``peak_rss_scope``). Grader worker
    processes are not included.

``--prompts``, ``--n`` and ``--max-new-tokens`` apply to every part (defaults 4, 8, 48: the
default job's batch). Output: a markdown table on stdout; with ``--out DIR``, ``bench.json``
(settings, environment, every raw value) and ``bench.md``. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from graft.config import Config, ConfigError, ModelConfig, load_config

PARTS = ("a", "b", "c")
DEFAULT_MODEL = "embedded:smollm2-135m-instruct"
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


def _doc_list(title: str, items: tuple[str, ...]) -> str:
    return f"\n{title}\n\n" + "".join(f"- {s}\n" for s in items)


__doc__ += _doc_list("TRL settings matched in (a):", TRL_MATCHED) + _doc_list("Differences that remain in (a):", TRL_DIFFERENCES)


# ============================================================================ pure helpers

def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def series(values: list) -> dict:
    """``{"median", "values"}`` of a list of numbers (``None`` entries are skipped by the median)."""
    nums = [v for v in values if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))]
    return {"median": statistics.median(nums) if nums else None, "values": list(values)}


def summarize(rows: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: series([r.get(k) for r in rows]) for k in keys}


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become ``None``, tuples lists, unknown objects their ``str``."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux >= 4.0); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_gb() -> float:
    """``ru_maxrss`` in GiB (Linux reports KiB): the peak since the last :func:`reset_peak_rss`."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rss_gb() -> float | None:
    try:
        m = re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(m.group(1)) / 2**20 if m else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment() -> dict:
    env = {
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "transformers": package_version("transformers"), "trl": package_version("trl"),
        "graft": package_version("graft"), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def alternate(reps: int, sides: list[tuple[str, Callable[[int], dict]]], part: str,
              describe: Callable[[dict], str]) -> dict[str, list[dict]]:
    """Run ``reps`` rounds of every side in order (A, B, A, B, ...); each side's rows get the
    peak RSS of their own run (``peak_rss_gb``), the resident size after it (``rss_gb``) and the
    torch thread count it ran with."""
    out: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for i in range(reps):
        for name, fn in sides:
            scoped = reset_peak_rss()
            row = fn(i)
            row |= {"peak_rss_gb": peak_rss_gb(), "peak_rss_scope": "side" if scoped else "process", "rss_gb": rss_gb(),
                    "torch_threads": torch.get_num_threads()}
            out[name].append(row)
            progress(f"({part}) rep {i + 1}/{reps} {name}: {describe(row)}")
    return out


def _fmt(v: Any, unit: str = "", digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def _steps_line(row: dict) -> str:
    parts = [f"{k.replace('_s', '')} {_fmt(row.get(k), ' s')}" for k in ("step_s", "rollout_s", "score_s", "exchange_s", "update_s")
             if row.get(k) is not None]
    return ", ".join(parts)


# ============================================================================ configuration

def parse_only(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ConfigError(f"--only {text!r}: give a comma-separated subset of {','.join(PARTS)}")
    return tuple(p for p in PARTS if p in parts)


def default_config_path() -> Path:
    return Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def bench_config(args: argparse.Namespace, run_root: Path) -> Config:
    """The config every part starts from: ``--config`` + overrides + the bench's sizes and switches."""
    path = args.config or default_config_path()
    sets = [f"batch_prompts={args.prompts}", f"rollout.n={args.n}", f"rollout.max_new_tokens={args.max_new_tokens}",
            "progress=false", "resume=false", f"run_dir={run_root / 'base'}"]
    if args.threads is not None:
        sets.append(f"threads={args.threads}")
    if args.device is not None:
        sets.append(f"device={args.device}")
    return load_config(path, [*args.overrides, *sets])


def _slug(path: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path.split(":")[-1].rstrip("/")).name).strip("-")
    return name or "model"


def model_entry(cfg: Config, path: str) -> ModelConfig:
    """The config's entry for model ``path`` (its name, template, lr ...), or a new one: the chat
    template (2 worked examples) when the tokenizer has one, else the few-shot text template."""
    for m in cfg.models:
        if m.path == path:
            return m
    from graft.policy.loading import load_tokenizer

    template = "chat" if getattr(load_tokenizer(path), "chat_template", None) else "fewshot"
    lr = cfg.models[0].lr if cfg.models else ModelConfig.lr
    return ModelConfig(name=_slug(path), path=path, template=template, fewshot=2, lr=lr)


def single_model_config(cfg: Config, entry: ModelConfig, run_dir: Path, **update) -> Config:
    """``cfg`` training ``entry`` alone with GRPO, in-process (``backend: local``)."""
    return dataclasses.replace(cfg, models=[entry], run_dir=str(run_dir), backend="local",
                               exchange=dataclasses.replace(cfg.exchange, mode="grpo"),
                               peer=dataclasses.replace(cfg.peer, source="live"),
                               update=dataclasses.replace(cfg.update, **update))


def check_inputs(args: argparse.Namespace, cfg: Config, parts: tuple[str, ...]) -> None:
    """Reject bad input before any model is loaded."""
    from graft.policy.loading import resolve_model_path

    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    if args.max_tries < 1:
        raise ConfigError(f"--max-tries must be >= 1, got {args.max_tries}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} exists and is not a folder")
    paths = ([args.model] if "a" in parts else []) + (list(models_for_b(args, cfg)) if "b" in parts else [])
    for p in paths:
        resolve_model_path(p)
    if "c" in parts and (cfg.peer.source != "live" or len(cfg.models) != 2):
        raise ConfigError("part c compares GRAFT with GRPO on a pair: the config needs exactly two models and "
                          "peer.source=live (use --only a,b otherwise)")


def models_for_b(args: argparse.Namespace, cfg: Config) -> tuple[str, ...]:
    if args.models:
        return tuple(m.strip() for m in args.models.split(",") if m.strip())
    return tuple(m.path for m in cfg.models)


# ============================================================================ (a) graft GRPO step vs TRL

GRAFT_STEP_KEYS = ("step_s", "rollout_s", "score_s", "update_s", "tokens_generated", "rollout_tokens_per_s",
                   "tokens_update", "reward_mean", "peak_rss_gb")
TRL_STEP_KEYS = ("step_s", "rollout_s", "score_s", "update_s", "train_call_s", "tokens_generated", "rollout_tokens_per_s",
                 "reward_mean", "peak_rss_gb")


def rollout_rate(row: dict) -> dict:
    """``row`` with ``rollout_tokens_per_s`` = tokens generated / rollout seconds (None without a rollout time)."""
    sec = row.get("rollout_s")
    return row | {"rollout_tokens_per_s": row["tokens_generated"] / sec if sec else None}


def step_row(metrics: dict, names: list[str]) -> dict:
    """Timings and counts of one :func:`graft.trainer.loop.train_step` result (summed over models)."""
    total = lambda key: sum(metrics.get(f"{n}/{key}", 0) or 0 for n in names)  # noqa: E731
    row = {f"{ph}_s": metrics.get(f"time/{ph}_s") for ph in ("step", "rollout", "score", "exchange", "update")}
    row |= {"tokens_generated": total("tokens/generated"), "tokens_update": total("tokens/update"),
            "reward_mean": statistics.mean(metrics.get(f"{n}/reward/mean", 0.0) for n in names),
            "metrics": metrics}
    return row


def rewound_step(run, state: dict, step: int) -> dict:
    """One :func:`train_step` on the prompts the sampler gives from ``state``."""
    from graft.trainer.loop import train_step

    run.sampler.load_state_dict(json.loads(json.dumps(state)))
    return train_step(run, step)


def bench_a(base: Config, model: str, reps: int, run_root: Path) -> dict:
    from graft.trainer.loop import setup
    from graft.distributed.ray_backend import close_learners

    entry = dataclasses.replace(model_entry(base, model), dtype="float32")
    cfg = single_model_config(base, entry, run_root / "a", adv_eps=TRL_ADV_EPS)
    progress(f"(a) loading {model} for graft")
    run = setup(cfg)
    state = run.sampler.state_dict()
    prompts, _ = run.sampler.next_batch()
    learner = run.learners[entry.name]
    out: dict = {"model": model, "name": entry.name, "template": entry.template, "prompts": [p.id for p in prompts],
                 "matched": list(TRL_MATCHED), "differences": list(TRL_DIFFERENCES) + micro_batch_difference(cfg)}
    trl = None
    try:
        reason = trl_unavailable_reason()
        if reason is None:
            reason = trl_batch_problem(cfg)
        if reason is None:
            progress(f"(a) loading {model} for TRL {package_version('trl')}")
            try:
                trl = TrlBench(cfg, entry, prompts, run.grader, learner, run_root / "a-trl")
                out["prompt_ids_match"] = trl.prompt_ids_match
            except TrlUnsupported as e:
                reason = str(e)
        sides = [("graft", lambda i: rollout_rate(step_row(rewound_step(run, state, i + 1), [entry.name])))]
        if trl is not None:
            sides.append(("trl", lambda i: rollout_rate(trl.step())))
        rows = alternate(reps, sides, "a", _steps_line)
        out["graft"] = summarize(rows["graft"], GRAFT_STEP_KEYS) | {"raw": rows["graft"]}
        if trl is not None:
            out["trl"] = summarize(rows["trl"], TRL_STEP_KEYS) | {"raw": rows["trl"], "version": package_version("trl"),
                                                                  "config": trl.config_kwargs}
        else:
            out["trl"] = {"skipped": reason}
            progress(f"(a) TRL side skipped: {reason}")
    finally:
        run.grader.close()
        close_learners(run.learners)
    return out


# ---------------------------------------------------------------------------- TRL helper section

class TrlUnsupported(RuntimeError):
    """The installed TRL cannot be set up to match graft (the message says why)."""


def trl_unavailable_reason() -> str | None:
    """None when TRL can be imported, else why not (one line)."""
    if importlib.util.find_spec("trl") is None:
        return "TRL is not installed (pip install 'graft[bench]')"
    try:
        import trl  # noqa: F401
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an incompatible TRL is reported, not raised
        return f"TRL cannot be imported: {type(e).__name__}: {e}".splitlines()[0]
    return None


def trl_batch_problem(cfg: Config) -> str | None:
    """Why TRL cannot take graft's batch as M equal minibatches of whole groups, or None."""
    M, P = cfg.update.num_minibatches, cfg.batch_prompts
    if P % M:
        return (f"{P} prompts do not split into update.num_minibatches={M} equal minibatches "
                "(TRL needs equal ones; choose --prompts a multiple of it)")
    return None


def micro_batch_difference(cfg: Config) -> list[str]:
    """The micro-batching difference of (a), when graft splits a minibatch that TRL forwards at once."""
    rows = cfg.batch_prompts * cfg.rollout.n // cfg.update.num_minibatches
    if cfg.update.micro_batch_size >= rows:
        return []
    return [f"micro-batches: graft forwards each minibatch of {rows} completions in micro-batches of "
            f"update.micro_batch_size={cfg.update.micro_batch_size}, TRL all {rows} at once"]


def trl_config_kwargs(cfg: Config, entry: ModelConfig, out_dir: Path, on_cpu: bool, fields: set[str]) -> dict:
    """``GRPOConfig`` keyword arguments matching graft's ``cfg`` (see :data:`TRL_MATCHED`)."""
    rc, up = cfg.rollout, cfg.update
    M = up.num_minibatches
    ckpt = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kw = dict(
        output_dir=str(out_dir), seed=cfg.seed, max_steps=M, report_to="none", save_strategy="no",
        logging_steps=10**9, disable_tqdm=True, dataloader_num_workers=0, use_cpu=on_cpu, bf16=False, fp16=False,
        num_generations=rc.n, per_device_train_batch_size=cfg.batch_prompts * rc.n // M, steps_per_generation=M,
        gradient_accumulation_steps=1, num_iterations=up.epochs, max_completion_length=rc.max_new_tokens,
        temperature=rc.temperature, top_p=rc.top_p, top_k=0,
        loss_type="bnpo", beta=0.0, epsilon=up.clip_low, epsilon_high=up.clip_high, importance_sampling_level="token",
        scale_rewards="group", mask_truncated_completions=False,
        learning_rate=entry.lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=entry.betas[0], adam_beta2=entry.betas[1], adam_epsilon=1e-8, weight_decay=entry.weight_decay,
        max_grad_norm=entry.max_grad_norm, use_vllm=False, disable_dropout=True, log_completions=False,
        remove_unused_columns=False, shuffle_dataset=True,
    )
    kw[ckpt] = False
    return kw


class TrlBench:
    """A TRL ``GRPOTrainer`` on a fresh copy of ``entry`` whose :meth:`step` is one generation
    batch of ``prompts`` trained for ``update.num_minibatches`` optimizer steps."""

    def __init__(self, cfg: Config, entry: ModelConfig, prompts, grader, learner, out_dir: Path):
        from datasets import Dataset
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback
        from trl import GRPOConfig, GRPOTrainer

        from graft.policy.loading import load_model, load_tokenizer

        device = learner.policy.device
        fields = {f.name for f in dataclasses.fields(GRPOConfig)}
        self.config_kwargs = trl_config_kwargs(cfg, entry, out_dir, device.type == "cpu", fields)
        missing = sorted(set(self.config_kwargs) - fields)
        if missing:
            raise TrlUnsupported(f"TRL {package_version('trl')} has no GRPOConfig field(s) {', '.join(missing)}; "
                                 "the bench cannot match graft's settings with it (tested with trl 1.16)")
        tokenizer = load_tokenizer(entry)
        model = load_model(entry, device=str(device))
        texts = [learner.render_prompt(p.problem) for p in prompts]
        self.prompt_ids_match = [list(ids) for ids in tokenizer(text=texts)["input_ids"]] == \
            [learner.encode_prompt(p.problem) for p in prompts]
        self._rewards: list[list[float]] = []
        self._tokens: list[int] = []

        def graft_grader(completions, answer, completion_ids=None, **_):
            rewards, _status = grader.grade(list(completions), list(answer))
            self._rewards.append(rewards)
            self._tokens.append(sum(len(c) for c in completion_ids or []))
            return rewards

        clock = self._clock = {"begin": [], "end": []}

        class _Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                clock["begin"].append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):
                clock["end"].append(time.perf_counter())

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trainer = GRPOTrainer(
                model=model, reward_funcs=graft_grader, processing_class=tokenizer, callbacks=[_Clock()],
                args=GRPOConfig(**self.config_kwargs),
                train_dataset=Dataset.from_list([{"prompt": t, "answer": p.answer} for t, p in zip(texts, prompts)]))
        self.trainer.remove_callback(PrinterCallback)   # it prints the end-of-train metrics on stdout
        self._spans = {"rollout": [], "score": []}
        for phase, method in (("rollout", "_generate"), ("score", "_calculate_rewards")):
            if hasattr(self.trainer, method):
                setattr(self.trainer, method, _timed(getattr(self.trainer, method), self._spans[phase]))

    def step(self) -> dict:
        for sink in (self._clock["begin"], self._clock["end"], self._spans["rollout"], self._spans["score"],
                     self._rewards, self._tokens):
            sink.clear()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trainer.train()
        call = time.perf_counter() - t0
        step = self._clock["end"][-1] - self._clock["begin"][0]
        rollout = sum(self._spans["rollout"]) if self._spans["rollout"] else None
        score = sum(self._spans["score"]) if self._spans["score"] else None
        rewards = [r for rs in self._rewards for r in rs]
        return {"step_s": step, "rollout_s": rollout, "score_s": score,
                "update_s": step - (rollout or 0.0) - (score or 0.0) if rollout is not None else None,
                "train_call_s": call, "optimizer_steps": len(self._clock["end"]),
                "tokens_generated": sum(self._tokens), "reward_mean": statistics.mean(rewards) if rewards else None}


def _timed(fn: Callable, sink: list[float]) -> Callable:
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)
    return wrapper


# ============================================================================ (b) graft rollout vs model.generate

ROLLOUT_KEYS = ("seconds", "tokens", "tokens_per_s", "peak_rss_gb")
BF16_KEYS = ("recompute_s", "tokens_per_s_with_recompute", "logprob_gap_mean", "logprob_gap_max")


def generated_lengths(gen: torch.Tensor, stop_ids: set[int], pad_id: int) -> list[int]:
    """Tokens of each ``model.generate`` row [B, T] up to and including its first stop token; a row
    without one ends at its first pad (cut by a stop string) or runs the full width."""
    stops = torch.tensor(sorted(stop_ids), dtype=gen.dtype, device=gen.device)
    out = []
    for row in gen:
        hit = torch.isin(row, stops).nonzero()
        if len(hit):
            out.append(int(hit[0]) + 1)
            continue
        pad = (row == pad_id).nonzero()
        out.append(int(pad[0]) if len(pad) else row.numel())
    return out


@torch.no_grad()
def hf_generate(policy, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float, top_p: float,
                batch_size: int, stop_strings: list[str]) -> int:
    """``n`` samples per prompt with plain ``model.generate`` (``batch_size`` sequences per call,
    prompts left-padded); returns the number of generated tokens."""
    per_call = max(1, batch_size // n)
    extra = {"stop_strings": stop_strings, "tokenizer": policy.tokenizer} if stop_strings else {}
    tokens = 0
    for s in range(0, len(prompt_ids), per_call):
        chunk = prompt_ids[s:s + per_call]
        L = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), L), policy.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, p in enumerate(chunk):
            ids[b, L - len(p):] = torch.tensor(p)
            attn[b, L - len(p):] = 1
        out = policy.model.generate(input_ids=ids.to(policy.device), attention_mask=attn.to(policy.device),
                                    do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                    max_new_tokens=max_new_tokens, num_return_sequences=n,
                                    pad_token_id=policy.pad_token_id, eos_token_id=sorted(policy.stop_ids), **extra)
        tokens += sum(generated_lengths(out[:, L:], policy.stop_ids, policy.pad_token_id))
    return tokens


def _rate(seconds: float, tokens: int) -> dict:
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / max(seconds, 1e-9)}


def bench_b(base: Config, models: tuple[str, ...], reps: int, run_root: Path) -> dict:
    from graft.trainer.loop import setup, step_seed
    from graft.distributed.ray_backend import close_learners

    out = {}
    for k, path in enumerate(models):
        entry = model_entry(base, path)
        cfg = single_model_config(base, entry, run_root / f"b{k}")
        progress(f"(b) loading {path}")
        run = setup(cfg)
        try:
            prompts, _ = run.sampler.next_batch()
            learner, rc = run.learners[entry.name], cfg.rollout
            policy = learner.policy
            prompt_ids = [learner.encode_prompt(p.problem) for p in prompts]
            stops = entry.stop_strings()

            def graft_side(i: int) -> dict:
                t0 = time.perf_counter()
                groups, _ = learner.rollout(prompts, rc, i + 1, step_seed(cfg.seed, i + 1, entry.name))
                return _rate(time.perf_counter() - t0, sum(len(t) for g in groups for t in g.token_ids))

            def hf_side(i: int) -> dict:
                torch.manual_seed(step_seed(cfg.seed, i + 1, entry.name))
                t0 = time.perf_counter()
                tokens = hf_generate(policy, prompt_ids, rc.n, rc.max_new_tokens, rc.temperature, rc.top_p,
                                     rc.batch_size, stops)
                return _rate(time.perf_counter() - t0, tokens)

            def bf16_side(i: int) -> dict:
                learner.workers.call("set_engine", [("hf-bf16",)], "set_engine")   # the bf16 copy, untimed
                try:
                    t0 = time.perf_counter()
                    groups, _ = learner.rollout(prompts, rc, i + 1, step_seed(cfg.seed, i + 1, entry.name))
                    t1 = time.perf_counter()
                    gap = learner.recompute_old_logprobs(groups, cfg.update, rc.temperature)
                    t2 = time.perf_counter()
                finally:
                    learner.workers.call("set_engine", [("hf",)], "set_engine")
                tokens = sum(len(t) for g in groups for t in g.token_ids)
                return _rate(t1 - t0, tokens) | {"recompute_s": t2 - t1, "tokens_per_s_with_recompute": tokens / (t2 - t0),
                                                 "logprob_gap_mean": gap["logprob_gap/mean_abs"],
                                                 "logprob_gap_max": gap["logprob_gap/max_abs"]}

            rows = alternate(reps, [("graft", graft_side), ("graft_bf16", bf16_side), ("generate", hf_side)],
                             f"b {entry.name}",
                             lambda r: f"{r['seconds']:.1f} s, {r['tokens']} tokens, {r['tokens_per_s']:.1f} tok/s")
            out[path] = {"name": entry.name, "template": entry.template, "stop_strings": stops,
                         "graft": summarize(rows["graft"], ROLLOUT_KEYS) | {"raw": rows["graft"]},
                         "graft_bf16": summarize(rows["graft_bf16"], ROLLOUT_KEYS + BF16_KEYS) | {"raw": rows["graft_bf16"]},
                         "generate": summarize(rows["generate"], ROLLOUT_KEYS) | {"raw": rows["generate"]},
                         "generate_kwargs": {"do_sample": True, "temperature": rc.temperature, "top_p": rc.top_p,
                                             "top_k": 0, "max_new_tokens": rc.max_new_tokens,
                                             "num_return_sequences": rc.n, "eos_token_id": sorted(policy.stop_ids),
                                             "stop_strings": stops, "prompts_per_call": max(1, rc.batch_size // rc.n)}}
        finally:
            run.grader.close()
            close_learners(run.learners)
            del run
            gc.collect()
    return out


# ============================================================================ (c) GRAFT step vs GRPO step

PAIR_KEYS = ("step_s", "rollout_s", "score_s", "exchange_s", "update_s", "exchange_share", "transferred", "admitted",
             "peer_responses", "tries", "peak_rss_gb")


def exchange_counts(metrics: dict) -> dict:
    """Responses transferred and admitted over all directions of one step's metrics."""
    pick = lambda suffix: sum(v or 0 for k, v in metrics.items() if k.startswith("exchange/") and k.endswith(suffix))  # noqa: E731
    return {"transferred": pick("/transferred"), "admitted": pick("/admitted")}


def pair_row(metrics: dict, names: list[str], tries: int) -> dict:
    row = step_row(metrics, names) | exchange_counts(metrics)
    row["peer_responses"] = sum(metrics.get(f"{n}/peer_responses", 0) or 0 for n in names)
    row["exchange_share"] = (row["exchange_s"] or 0.0) / row["step_s"] if row["step_s"] else None
    row["tries"] = tries
    return row


def bench_c(base: Config, reps: int, run_root: Path, keep_balance: bool, max_tries: int) -> dict:
    from graft.trainer.loop import setup, train_step
    from graft.distributed.ray_backend import close_learners

    exchange = dataclasses.replace(base.exchange, mode="graft", **({} if keep_balance else {"balance": "none"}))
    cfg = dataclasses.replace(base, run_dir=str(run_root / "c"), exchange=exchange)
    modes = {m: dataclasses.replace(cfg, exchange=dataclasses.replace(exchange, mode=m)) for m in ("graft", "grpo")}
    progress(f"(c) loading {', '.join(m.path for m in cfg.models)}")
    run = setup(cfg)
    names = list(run.learners)
    steps = iter(range(1, 10**9))
    last = {}   # sampler state before the GRAFT step that the next GRPO repetition repeats

    def graft_side(i: int) -> dict:
        run.cfg = modes["graft"]
        tried = []
        for t in range(1, max_tries + 1):
            last["state"] = run.sampler.state_dict()
            m = train_step(run, next(steps))
            tried.append(exchange_counts(m) | {"step_s": m.get("time/step_s")})
            if exchange_counts(m)["transferred"] > 0:
                break
            progress(f"(c) rep {i + 1}: GRAFT step {t}/{max_tries} handed nothing over"
                     + ("; trying the next prompts" if t < max_tries else "; this repetition has no exchange"))
        return pair_row(m, names, t) | {"attempts": tried}

    def grpo_side(i: int) -> dict:
        run.cfg = modes["grpo"]
        try:
            return pair_row(rewound_step(run, last["state"], next(steps)), names, 1)
        finally:
            run.cfg = modes["graft"]

    try:
        rows = alternate(reps, [("graft", graft_side), ("grpo", grpo_side)], "c",
                         lambda r: _steps_line(r) + f", transferred {r['transferred']}, admitted {r['admitted']}")
    finally:
        run.grader.close()
        close_learners(run.learners)
    exchanged = [r for r in rows["graft"] if r["transferred"] > 0]
    return {
        "models": [m.path for m in cfg.models], "exchange_ensured_by": (
            f"config balancing exchange.balance={base.exchange.balance}, up to {max_tries} steps per repetition"
            if keep_balance else f"exchange.balance=none, up to {max_tries} steps per repetition"),
        "repetitions_with_exchange": len(exchanged),
        "graft": summarize(rows["graft"], PAIR_KEYS) | {"raw": rows["graft"]},
        "grpo": summarize(rows["grpo"], PAIR_KEYS) | {"raw": rows["grpo"]},
        "exchange_share_when_exchanged": series([r["exchange_share"] for r in exchanged]),
    }


# ============================================================================ output

def _median(part: dict, side: str, key: str):
    return ((part.get(side) or {}).get(key) or {}).get("median")


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def markdown(result: dict) -> str:
    env, s = result["environment"], result["settings"]
    lines = ["# graft bench", "",
             f"{env['cpu_model']} ({env['cpu_count']} CPUs), torch {env['torch']} ({env['torch_threads']} threads), "
             f"transformers {env['transformers']}, TRL {env['trl'] or 'not installed'}; {s['reps']} repetitions, "
             f"alternating; {s['prompts']} prompts x {s['n']} samples, {s['max_new_tokens']} new tokens. "
             "Medians; every raw value is in bench.json.", ""]
    a = result.get("a")
    if a:
        trl_ok = "skipped" not in a["trl"]
        lines += [f"## (a) GRPO step: graft vs TRL GRPOTrainer — `{a['model']}`", ""]
        if not trl_ok:
            lines += [f"TRL side: {a['trl']['skipped']}", ""]
        lines += ["| median (seconds unless said) | graft | TRL | TRL / graft |", "|---|---|---|---|"]
        for key, label in (("step_s", "step"), ("rollout_s", "rollout"), ("score_s", "score"), ("update_s", "update"),
                           ("tokens_generated", "tokens generated"), ("rollout_tokens_per_s", "rollout tokens/s"),
                           ("peak_rss_gb", "peak RSS (GiB)")):
            g, t = _median(a, "graft", key), _median(a, "trl", key)
            digits = 0 if key == "tokens_generated" else 2
            lines.append(f"| {label} | {_fmt(g, digits=digits)} | {_fmt(t, digits=digits)} | {_fmt(_ratio(t, g), 'x', 2)} |")
        if trl_ok:
            lines += ["", f"TRL `train()` call incl. its set-up: {_fmt(_median(a, 'trl', 'train_call_s'), ' s', 2)}; "
                      f"prompt token ids identical: {a.get('prompt_ids_match')}; graft forwarded "
                      f"{_fmt(_median(a, 'graft', 'tokens_update'), digits=0)} tokens in its update."]
        lines += ["", "Matched TRL settings:", ""] + [f"- {x}" for x in a["matched"]]
        lines += ["", "Differences that remain:", ""] + [f"- {x}" for x in a["differences"]] + [""]
    b = result.get("b")
    if b:
        lines += ["## (b) rollout: graft's sampler vs `model.generate`", "",
                  "| model | graft s | graft tok/s | generate s | generate tok/s | graft speed-up |", "|---|---|---|---|---|---|"]
        for path, m in b.items():
            gs, gt = _median(m, "graft", "seconds"), _median(m, "graft", "tokens_per_s")
            hs, ht = _median(m, "generate", "seconds"), _median(m, "generate", "tokens_per_s")
            lines.append(f"| `{path}` | {_fmt(gs, digits=2)} | {_fmt(gt)} | {_fmt(hs, digits=2)} | {_fmt(ht)} | "
                         f"{_fmt(_ratio(hs, gs), 'x', 2)} |")
        lines += ["", "graft's sampler over a bf16 copy of the weights (`rollout.engine=hf-bf16`), then the fp32 forward "
                  "that recomputes the behaviour log-probs (`update.recompute_old_logprobs=true`, which that engine requires):", "",
                  "| model | bf16 s | bf16 tok/s | recompute s | bf16 + recompute tok/s | vs graft fp32 | "
                  "log-prob gap mean / max (nats) |", "|---|---|---|---|---|---|---|"]
        for path, m in b.items():
            if "graft_bf16" not in m:
                continue
            q = lambda key: _median(m, "graft_bf16", key)  # noqa: E731
            lines.append(f"| `{path}` | {_fmt(q('seconds'), digits=2)} | {_fmt(q('tokens_per_s'))} | "
                         f"{_fmt(q('recompute_s'), digits=2)} | {_fmt(q('tokens_per_s_with_recompute'))} | "
                         f"{_fmt(_ratio(q('tokens_per_s_with_recompute'), _median(m, 'graft', 'tokens_per_s')), 'x', 2)} | "
                         f"{_fmt(q('logprob_gap_mean'), digits=4)} / {_fmt(q('logprob_gap_max'), digits=3)} |")
        lines.append("")
    c = result.get("c")
    if c:
        lines += [f"## (c) GRAFT step vs GRPO step on the pair ({', '.join(f'`{m}`' for m in c['models'])})", "",
                  f"Exchange ensured by: {c['exchange_ensured_by']}; repetitions with an exchange: "
                  f"{c['repetitions_with_exchange']} of {s['reps']}.", "",
                  "| | GRAFT | GRPO | GRAFT - GRPO |", "|---|---|---|---|"]
        for key, label in (("step_s", "step s"), ("rollout_s", "rollout s"), ("score_s", "score s"),
                           ("exchange_s", "exchange s"), ("update_s", "update s"), ("transferred", "responses transferred"),
                           ("admitted", "responses admitted"), ("peak_rss_gb", "peak RSS (GiB)")):
            g, r = _median(c, "graft", key), _median(c, "grpo", key)
            diff = g - r if isinstance(g, (int, float)) and isinstance(r, (int, float)) else None
            lines.append(f"| {label} | {_fmt(g, digits=2)} | {_fmt(r, digits=2)} | {_fmt(diff, digits=2)} |")
        share = c["exchange_share_when_exchanged"]["median"]
        lines += ["", f"Exchange share of the GRAFT step (`time/exchange_s / time/step_s`, steps with an exchange): "
                  f"{_fmt(None if share is None else 100 * share, ' %')}", ""]
    lines += ["## (d) peak RSS of the bench process (GiB, per repetition side; max over repetitions)", "",
              "| part | side | peak RSS |", "|---|---|---|"]
    for part, side, peak in peak_rows(result):
        lines.append(f"| {part} | {side} | {_fmt(peak, digits=2)} |")
    return "\n".join(lines) + "\n"


def peak_rows(result: dict) -> list[tuple[str, str, float]]:
    out = []
    for part in PARTS:
        blocks = {"": result[part]} if part in ("a", "c") and part in result else result.get(part, {})
        for label, block in blocks.items():
            for side in ("graft", "graft_bf16", "trl", "generate", "grpo"):
                raw = (block.get(side) or {}).get("raw")
                if raw:
                    out.append((f"{part} {label}".strip(), side, max(r["peak_rss_gb"] for r in raw)))
    return out


# ============================================================================ CLI

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graft bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time graft's GRPO step against TRL (a), graft's rollout against model.generate (b) and the GRAFT "
                    "step against the GRPO step (c), alternating repetitions; medians and raw values.",
        epilog=_doc_list("TRL settings matched in (a):", TRL_MATCHED) + _doc_list("Differences that remain:", TRL_DIFFERENCES))
    p.add_argument("--only", default="a,b,c", help="parts to run, comma-separated subset of a,b,c (default: all)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per side (default 3)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model of part a (default {DEFAULT_MODEL})")
    p.add_argument("--models", default=None, help="comma-separated models of part b (default: the config's models)")
    p.add_argument("--config", default=None, help="YAML config (default: configs/default.yaml); its model entries give "
                   "templates and learning rates, its pair is part c")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="response length limit (default 48)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the config's)")
    p.add_argument("--device", default=None, help="auto, cpu or cuda (default: the config's)")
    p.add_argument("--out", default=None, help="folder for bench.json and bench.md")
    p.add_argument("--keep-balance", action="store_true", help="part c: keep the config's exchange.balance "
                   "(default: exchange.balance=none so that peer groups are handed over)")
    p.add_argument("--max-tries", type=int, default=4, help="part c: GRAFT steps tried per repetition until one hands "
                   "peer groups over (default 4)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. rollout.temperature=1.0)")
    return p


def bench_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    parts = parse_only(args.only)
    with tempfile.TemporaryDirectory(prefix="graft-bench-") as tmp:
        run_root = Path(tmp)
        base = bench_config(args, run_root)
        check_inputs(args, base, parts)
        if base.threads:
            torch.set_num_threads(base.threads)
        result: dict = {"settings": {"parts": list(parts), "reps": args.reps, "model": args.model,
                                     "models": list(models_for_b(args, base)) if "b" in parts else [],
                                     "config": str(args.config or default_config_path()), "overrides": args.overrides,
                                     "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
                                     "threads": base.threads, "device": base.device, "keep_balance": args.keep_balance,
                                     "max_tries": args.max_tries, "temperature": base.rollout.temperature,
                                     "top_p": base.rollout.top_p, "num_minibatches": base.update.num_minibatches,
                                     "micro_batch_size": base.update.micro_batch_size},
                        "environment": environment()}
        t0 = time.perf_counter()
        if "a" in parts:
            result["a"] = bench_a(base, args.model, args.reps, run_root)
            gc.collect()
        if "b" in parts:
            result["b"] = bench_b(base, models_for_b(args, base), args.reps, run_root)
            gc.collect()
        if "c" in parts:
            result["c"] = bench_c(base, args.reps, run_root, args.keep_balance, args.max_tries)
        result["wall_clock_s"] = time.perf_counter() - t0
    result = clean(result)
    md = markdown(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(result, indent=2, allow_nan=False))
        (out / "bench.md").write_text(md)
        progress(f"wrote {out / 'bench.json'} and {out / 'bench.md'}")
    print(md)
    return 0
