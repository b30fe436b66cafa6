"""Rollout engines: who samples the G responses per prompt, with their per-token log-probs.

Every engine answers :meth:`RolloutEngine.generate` with the result type of
:meth:`graft.policy.policy.Policy.generate` (``[P][G]`` :class:`~graft.types.Sample`:
token ids including the stop token when finished, the sampler's log-prob of each token,
text decoded by the policy's tokenizer, finished flag), and is told after every optimiser
pass that the trainer's weights changed (:meth:`RolloutEngine.weights_updated`).

``rollout.engine`` picks one:

``hf``
    :meth:`Policy.generate` (own KV-cache loop, CPU or GPU). Shares the trainer's weights,
    so nothing is pushed. With ``SamplingParams.seeds`` (one per prompt) every sample draws from its own
    generator, so a sample depends only on (seed, prompt index, sample index) and the
    weights -- not on batch size or on how prompts are split over Ray workers.
``hf-bf16``
    the same sampler over a bfloat16 copy of the trainer's weights (refreshed after every
    optimiser pass): about twice the tokens/s of fp32 on CPUs with native bf16 matmuls, for
    +2 bytes per parameter. Its log-probs are the bf16 copy's, ~0.01 nats per token from the
    fp32 forward on average and up to ~0.4 on single tokens (measured on the default pair), so
    the config requires ``update.recompute_old_logprobs=true``: the behaviour log-probs
    (``old_logprobs``, and the source side of ``s``) then come from a forward pass of the
    training weights right after sampling, and ``MODEL/logprob_gap/*`` reports the difference.
    On a 2-core CPU that forward costs about what bf16 sampling saves (README, Measurements);
    evaluation, which needs no log-probs, gains the full ~2x. Unsharded models only.
``hf-cb``
    transformers' continuous batching (``model.generate_batch`` with paged attention and
    ``return_logprobs``). Shares the trainer's weights. One seed per call (the samples depend
    on scheduling, so runs are not bit-reproducible across worker counts).
``vllm``
    a vLLM engine (``vllm.LLM``) on the same GPU as the trainer (``gpu_memory_utilization``
    share of it, default 0.35; ``GRAFT_VLLM_GPU_MEMORY_UTILIZATION`` overrides). Per-sample
    seeds (vLLM's ``SamplingParams.seed``), log-probs of the sampled tokens (``logprobs=0``), the
    policy's stop ids. After each update the trainer's full weights are pushed in place with
    ``model.load_weights`` (LoRA adapters merged first) and the prefix cache is reset.
    Needs CUDA and ``pip install vllm``; requested without them it raises
    :class:`EngineUnavailable` naming what is missing.

Log-prob semantics. ``hf`` records ``log_softmax(logits / T)`` without top-p
renormalisation, the same as ``Policy.forward_logprobs``. ``hf-cb`` and ``vllm`` record the
log-prob of the distribution they sampled from; with the training defaults (T = 1,
top-p = 1) all three agree up to float rounding. With top-p < 1 set
``update.recompute_old_logprobs=true`` when using ``hf-cb``/``vllm``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import inspect
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig

from graft.config import Config
from graft.config.checks import check
from graft.policy.codec import TextCodec
from graft.policy.fsdp import iter_full_parameters
from graft.policy.loading import unwrap as _unwrap
from graft.policy.sampling import SamplingParams
from graft.registry import ENGINES
from graft.seeds import prompt_seeds, sample_seed
from graft.types import Sample

try:  # transformers >= 5
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    _HAS_CB = True
except ImportError:  # pragma: no cover - older transformers: no hf-cb engine
    _HAS_CB = False  # ContinuousBatchingConfig is then undefined: every use is behind this flag

log = logging.getLogger(__name__)


def _vllm():
    """The ``vllm`` module (optional: ``pip install 'graft[vllm]'``, GPU)."""
    import vllm  # deferred: an optional, GPU-only dependency that is slow to import

    return vllm


class EngineUnavailable(RuntimeError):
    """The requested rollout engine cannot run here; the message says why and what to use instead."""


# ============================================================================ interface


class Sampler(Protocol):
    """What evaluation samples from: a text codec and ``generate`` (samples ended at the stop strings).
    Every rollout engine is one (a policy's, or vLLM serving a folder), and so is a
    :class:`graft.trainer.learner.Learner` (its ranks' engine)."""

    codec: TextCodec

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, progress: bool = False, desc: str = ""
    ) -> list[list[Sample]]:
        """``params.n`` samples per prompt, ``[P][G]``, each ended at its first stop string; ``progress``: a bar
        labelled ``desc``."""
        ...


class RolloutEngine:
    """Samples responses for one policy. Subclasses implement :meth:`_sample`."""

    name = "base"
    """Its registry name (``rollout.engine``), set by ``@ENGINES.register``."""

    @classmethod
    def check(cls, cfg: Config) -> None:
        """Refuse, when the config loads, settings this engine cannot run with: :func:`graft.config.checks.check`
        each invariant, naming the field from the top of the tree."""

    def __init__(self, policy, codec: TextCodec | None = None) -> None:
        self.policy = policy
        self.codec: TextCodec = codec if codec is not None else policy.codec
        """Prompts in, text out, stop strings: the policy's codec (or, serving a folder, the model's own)."""

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, progress: bool = False, desc: str = ""
    ) -> list[list[Any]]:
        """``params.n`` samples per prompt, ``[P][G]``, each ended at its first stop string
        (:func:`graft.policy.prompts.cut_at_stop`; ``params.stop_strings=None``: the policy's configured ones,
        ``ModelConfig.stop_strings()``). Rollouts, evaluation and probes all sample through here.
        ``params.entropy`` is honoured where the backend can (``hf``, ``hf-bf16``); ``progress``: a bar labelled
        ``desc``."""
        codec = self.codec
        stops = codec.stops if params.stop_strings is None else params.stop_strings
        out = self._sample(prompt_ids, dataclasses.replace(params, stop_strings=stops), progress, desc)
        return [[codec.cut(s, stops) for s in group] for group in out]

    def _sample(self, prompt_ids: list[list[int]], params: SamplingParams, progress: bool, desc: str) -> list[list[Any]]:
        """The backend's samples (``params.stop_strings``, resolved, may end rows early; :meth:`generate` does the
        cutting)."""
        raise NotImplementedError

    def weights_updated(self, named_parameters: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None) -> None:
        """The trainer changed the weights; ``named_parameters()`` yields (name, full tensor)
        pairs (the default: the policy model's own parameters). No-op for engines that share
        the trainer's weights."""

    def close(self) -> None:
        """Free the engine's memory."""


@ENGINES.register("hf")
class HFEngine(RolloutEngine):
    """:meth:`Policy.generate` (the reference sampler; per-sample seeds when given)."""

    sampling_model = None
    """The model to sample from instead of the policy's own (a subclass's copy); ``None``: the policy's."""

    def _sample(self, prompt_ids, params, progress, desc):
        return self.policy.generate(prompt_ids, params, model=self.sampling_model, progress=progress, desc=desc)


@ENGINES.register("hf-bf16")
class HFBf16Engine(HFEngine):
    """:meth:`Policy.generate` over a bfloat16 copy of the policy's model (see the module docstring)."""

    @classmethod
    def check(cls, cfg: Config) -> None:
        check(
            cfg.update.recompute_old_logprobs,
            "update.recompute_old_logprobs",
            "must be true with rollout.engine=hf-bf16: the bf16 sampler's log-probs differ from the training "
            "forward by up to ~0.4 nats per token, so the behaviour log-probs must come from a forward pass",
        )
        for name, res in cfg.ray.resources.items() if cfg.backend == "ray" else ():
            check(
                res.num_workers == 1,
                f"ray.resources.{name}.num_workers",
                "must be 1 with rollout.engine=hf-bf16 (its bf16 copy is of an unsharded model)",
            )

    def __init__(self, policy) -> None:
        super().__init__(policy)
        params = list(policy.model.parameters())
        if any(type(p).__name__ == "DTensor" for p in params):
            raise EngineUnavailable(
                "rollout.engine=hf-bf16 needs an unsharded model (one rank per model); "
                "use rollout.engine=hf, or models.i.dtype=bfloat16"
            )
        if any(p.dtype != torch.bfloat16 for p in params):
            with torch.no_grad():
                self.sampling_model = copy.deepcopy(policy.model).to(torch.bfloat16).eval().requires_grad_(False)

    @torch.no_grad()
    def weights_updated(self, named_parameters=None) -> None:
        if self.sampling_model is not None:
            for dst, src in zip(self.sampling_model.parameters(), self.policy.model.parameters(), strict=True):
                dst.copy_(src)

    def close(self) -> None:
        self.sampling_model = None


def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@ENGINES.register("hf-cb")
class ContinuousBatchingEngine(RolloutEngine):
    """transformers' continuous batching (``generate_batch``, paged KV cache, ``return_logprobs``)."""

    def __init__(self, policy) -> None:
        super().__init__(policy)
        reason = continuous_batching_unavailable_reason(policy.model)
        if reason:
            raise EngineUnavailable(f"rollout.engine=hf-cb: {reason}; use rollout.engine=hf")

    def _sample(self, prompt_ids, params, progress, desc):
        pol, p = self.policy, params
        if not prompt_ids:
            return []
        gc = GenerationConfig(
            do_sample=True,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=0,
            max_new_tokens=p.max_new_tokens,
            num_return_sequences=p.n,
            eos_token_id=sorted(pol.stop_ids),
            pad_token_id=pol.pad_token_id,
        )
        cbc = _paged_config(prompt_ids, p.max_new_tokens, p.batch_size, p.seeds[0] if p.seeds else p.seed)
        model = _unwrap(pol.model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                res = model.generate_batch(
                    [list(p) for p in prompt_ids],
                    generation_config=gc,
                    continuous_batching_config=cbc,
                    progress_bar=progress,
                    warmup=False,
                )
        finally:
            model.train(was_training)
        return self._samples(list(res.values()), len(prompt_ids), p.n)

    def _samples(self, outs: list, prompts: int, n: int) -> list[list[Sample]]:
        """``generate_batch``'s outputs (``n`` per prompt, in prompt order) as ``[P][G]`` samples."""
        if len(outs) != prompts * n:
            failed = [o.error for o in outs if getattr(o, "error", None)]
            raise RuntimeError(f"continuous batching returned {len(outs)} of {prompts * n} samples {failed[:3]}")
        samples = []
        for i in range(prompts):
            group = []
            for o in outs[i * n : (i + 1) * n]:
                toks = list(o.generated_tokens)
                fin = bool(toks) and toks[-1] in self.policy.stop_ids
                group.append(
                    Sample(
                        token_ids=toks,
                        logprobs=[float(x) for x in o.logprobs[: len(toks)]],
                        text=self.codec.decode(toks),
                        finished=fin,
                    )
                )
            samples.append(group)
        return samples


def _paged_config(prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int, seed: int) -> ContinuousBatchingConfig:
    """The continuous-batching config of one call, its paged cache sized for the requests at hand: left to
    itself, transformers sizes it from free memory (up to 90% of it), which on a CPU host is most of the
    machine's RAM."""
    per_seq = -(-(max(len(p) for p in prompt_ids) + max_new_tokens) // 256)
    return ContinuousBatchingConfig(
        return_logprobs=True,
        seed=seed % (2**31),
        max_requests_per_batch=max(1, batch_size),
        num_blocks=max(1, batch_size) * per_seq + 1,
        max_batch_tokens=4096,
    )


def continuous_batching_unavailable_reason(model: Any = None) -> str | None:
    if not _HAS_CB:
        return "this transformers has no continuous batching (needs transformers >= 5)"
    if "return_logprobs" not in getattr(ContinuousBatchingConfig, "__dataclass_fields__", {}) and not _accepts(
        ContinuousBatchingConfig, "return_logprobs"
    ):
        return "this transformers' continuous batching cannot return log-probs"
    if model is not None and not hasattr(_unwrap(model), "generate_batch"):
        return f"{type(model).__name__} has no generate_batch"
    return None


# ============================================================================ vLLM


def vllm_unavailable_reason() -> str | None:
    """Why a vLLM rollout engine cannot start here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install 'graft[vllm]')"
    if not torch.cuda.is_available():
        return "vllm needs a CUDA GPU and torch.cuda.is_available() is False"
    return None


def hf_weights(
    model: Any, named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of the base model's weights as ``load_weights`` expects them.

    PEFT: pass the parameters of a model whose LoRA adapters were merged; adapter tensors are
    skipped, ``base_model.model.`` and ``.base_layer`` are stripped from names."""
    items = named_parameters if named_parameters is not None else model.named_parameters()
    for name, t in items:
        if "lora_" in name or "modules_to_save" in name:
            continue
        name = name.replace("base_model.model.", "", 1) if name.startswith("base_model.model.") else name
        name = name.replace(".base_layer", "")
        yield name, t


def _vllm_load_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside vLLM's (in-process) worker: load full HF-named weights into the model."""
    model = worker.model_runner.model
    model.load_weights(weights=weights)
    return len(weights)


@ENGINES.register("vllm")
class VllmEngine(RolloutEngine):
    """vLLM colocated with the trainer on its GPU; weights pushed after each update.

    ``folder``: serve that Hugging Face folder (or hub id) instead of a Policy's in-memory weights --
    ``graft eval --backend vllm`` of a checkpoint; ``policy`` is then None, ``codec`` the model's
    :class:`~graft.policy.codec.TextCodec` (prompts, decoding, stop strings), and nothing is pushed."""

    def __init__(
        self,
        policy,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        folder: str | None = None,
        codec: TextCodec | None = None,
    ) -> None:
        self.available(folder)
        super().__init__(policy, codec)
        # The engine core runs in this process, so weights can be pushed by reference.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        LLM = _vllm().LLM

        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.folder = folder
        source = folder if folder is not None else self._model_folder()
        tokenizer = self.codec.cfg.tokenizer or source
        util = gpu_memory_utilization or float(
            os.environ.get("GRAFT_VLLM_GPU_MEMORY_UTILIZATION", "0.85" if folder is not None else "0.35")
        )
        if enforce_eager is None:
            enforce_eager = bool(int(os.environ.get("GRAFT_VLLM_EAGER", "0")))
        kwargs: dict[str, Any] = dict(
            model=source,
            tokenizer=tokenizer,
            dtype=self.codec.cfg.dtype,
            seed=0,
            gpu_memory_utilization=util,
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        try:
            self.llm = LLM(logprobs_mode="processed_logprobs", **kwargs)
            self.raw_logprobs = False
        except TypeError:  # vLLM < 0.10.2: log-probs of the raw logits, right only at temperature 1
            self.llm = LLM(**kwargs)
            self.raw_logprobs = True
            log.warning(
                "this vLLM returns log-probs of the raw logits; at temperature != 1 graft recomputes them "
                "with a forward pass of the policy (upgrade to vLLM >= 0.10.2 to avoid the extra pass)"
            )
        if folder is None:
            self.weights_updated()  # the policy may differ from the folder (resumed optimiser state etc.)

    @staticmethod
    def available(folder: str | None = None) -> None:
        """Raise :class:`EngineUnavailable` when vLLM cannot run here, or cannot serve ``folder``."""
        reason = vllm_unavailable_reason()
        if reason:
            raise EngineUnavailable(f"rollout.engine=vllm: {reason}; use rollout.engine=hf")
        if folder is not None and (str(folder).startswith("embedded:") or str(folder).endswith(".gguf")):
            raise EngineUnavailable(
                f"vllm needs a Hugging Face model folder or hub id, got {folder!r}; evaluate a "
                "saved checkpoint or exported folder, or use the hf backend"
            )

    def _model_folder(self) -> str:
        """A Hugging Face folder vLLM can read holding the policy's current weights."""
        self._tmp = tmp = tempfile.TemporaryDirectory(prefix="graft-vllm-")
        pol = self.policy
        model = _unwrap(pol.model)
        model.config.save_pretrained(tmp.name)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(tmp.name)
        pol.tokenizer.save_pretrained(tmp.name)
        # Weights: a real file is needed for the first load; the real values are pushed right after.
        state = {k: v.detach().to("cpu").contiguous() for k, v in hf_weights(model, _full_named_params(model))}
        dedup, seen = {}, {}
        for k, v in state.items():
            key = (v.data_ptr(), tuple(v.shape))
            if key in seen:
                continue
            seen[key] = k
            dedup[k] = v
        save_file(dedup, str(Path(tmp.name) / "model.safetensors"))
        return tmp.name

    def _sample(self, prompt_ids, params, progress, desc):
        VllmParams, codec, n = _vllm().SamplingParams, self.codec, params.n
        seeds = list(params.seeds) if params.seeds is not None else prompt_seeds(params.seed, 0, len(prompt_ids))
        requests, per_sample = [], []
        for ids, s in zip(prompt_ids, seeds, strict=True):
            for j in range(n):
                requests.append({"prompt_token_ids": list(ids)})
                per_sample.append(
                    VllmParams(
                        n=1,
                        temperature=params.temperature,
                        top_p=params.top_p,
                        max_tokens=params.max_new_tokens,
                        seed=sample_seed(s, j) % (2**31),
                        logprobs=0,
                        detokenize=False,
                        stop_token_ids=sorted(codec.stop_ids),
                        skip_special_tokens=True,
                    )
                )
        outs = self.llm.generate(requests, per_sample, use_tqdm=progress)
        samples, k = [], 0
        for _ in prompt_ids:
            group = []
            for _ in range(n):
                o = outs[k].outputs[0]
                k += 1
                toks = list(o.token_ids)
                lps = [_chosen_logprob(entry, t) for entry, t in zip(o.logprobs or [], toks, strict=False)]
                fin = o.finish_reason == "stop"
                group.append(Sample(token_ids=toks, logprobs=lps, text=codec.decode(toks), finished=fin))
            samples.append(group)
        if getattr(self, "raw_logprobs", False) and params.temperature != 1.0 and self.policy is not None:
            self._recompute_logprobs(prompt_ids, samples, params.temperature)
        return samples

    def _recompute_logprobs(self, prompt_ids, samples, temperature: float) -> None:
        """Replace raw-logit log-probs (old vLLM) by the policy's tempered log-probs of the same tokens,
        the value every other engine records (``log_softmax(logits / T)``)."""
        rows = [(i, s) for i, group in enumerate(samples) for s in group if s.token_ids]
        lps = self.policy.token_logprobs(
            [list(prompt_ids[i]) for i, _ in rows], [s.token_ids for _, s in rows], temperature=temperature
        )
        for (_, s), lp in zip(rows, lps, strict=True):
            s.logprobs = lp.tolist()

    def weights_updated(self, named_parameters=None) -> None:
        if self.folder is not None:
            return  # serving a folder: there are no trainer weights to push
        model = self.policy.model
        merged = False
        if named_parameters is None and hasattr(model, "merge_adapter"):
            model.merge_adapter()
            merged = True
        try:
            items = named_parameters() if named_parameters is not None else _full_named_params(model)
            batch, size = [], 0
            for name, t in hf_weights(model, items):
                batch.append((name, t.detach()))
                size += t.numel() * t.element_size()
                if size > (1 << 30):  # push in ~1 GiB slices
                    self.llm.collective_rpc(_vllm_load_weights, args=(batch,))
                    batch, size = [], 0
            if batch:
                self.llm.collective_rpc(_vllm_load_weights, args=(batch,))
        finally:
            if merged:
                model.unmerge_adapter()
        with contextlib.suppress(Exception):
            self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self.llm
        if self._tmp is not None:
            self._tmp.cleanup()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _chosen_logprob(entry: Any, token: int) -> float:
    """The sampled token's log-prob from a vLLM per-position logprobs entry (dict or flat)."""
    if entry is None:
        return float("nan")
    if isinstance(entry, dict):
        lp = entry.get(token)
        if lp is None:  # vLLM always lists the sampled token
            raise KeyError(f"vLLM gave no log-prob for the sampled token {token}")
        return float(lp.logprob if hasattr(lp, "logprob") else lp)
    return float(entry)


def _full_named_params(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Named parameters with full tensors (gathers FSDP2 DTensor shards; collective when sharded)."""
    return iter_full_parameters(model)


# ============================================================================ factory


def make_engine(kind: str, policy, **kwargs) -> RolloutEngine:
    """The rollout engine ``kind`` (a name of :data:`graft.registry.ENGINES`) for ``policy``; ``kwargs`` go to
    its constructor."""
    return ENGINES[kind](policy, **kwargs)
