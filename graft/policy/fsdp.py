"""FSDP2 (``torch.distributed.fsdp.fully_shard``) sharding of one model over its workers.

One model's Ray workers form a ``torch.distributed`` process group (gloo on CPU, NCCL on
CUDA). :func:`shard_model` applies ``fully_shard`` to every decoder layer and then to the
whole causal LM (the root unit holds the embeddings, the final norm and the LM head, so
tied embeddings stay in one unit). Every rank then holds 1/W of each parameter as a
``DTensor`` shard, plus its gradients and AdamW moments.

How graft drives the sharded model (the :class:`~graft.policy.policy.Policy` calls the
decoder and the LM head separately, never the root ``forward``):

- **Training** (:func:`root_call`): each micro-batch's ``Policy.forward_logprobs`` runs
  inside the root unit's forward hooks (``register_fsdp_forward_method``), so the root
  parameters are all-gathered once, decoder layers all-gather/free themselves, and the
  backward reduce-scatters every gradient. Gradients are **summed** over ranks
  (``set_gradient_divide_factor(1)``): each rank's loss is already divided by the global
  token count of the minibatch, so the sum of the rank losses is the full-batch loss and
  the summed gradient equals the single-process gradient. Every rank must run the same
  number of forward/backward passes (collectives inside); ranks with fewer micro-batches
  run zero-weighted dummy passes (:func:`dummy_backward`).
- **Rollout and scoring** (:func:`gathered`): all units are all-gathered once and kept
  unsharded (like FSDP1's ``summon_full_params``); then each rank samples or scores its own
  share of prompts with no collective per token, so ranks may run different numbers of
  forward passes. Memory: the full model on each rank for the duration of the rollout.
- **Saving** (:func:`full_state_dict`, :func:`gather_optimizer_state`): full tensors are
  gathered to rank 0 (CPU), in the same format as an unsharded run, so checkpoints of the
  local and the Ray backend are interchangeable.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import types
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from graft.policy.loading import unwrap as _unwrap

try:  # torch >= 2.6
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
    from torch.distributed.tensor import DTensor, distribute_tensor

    _FSDP2 = True
except ImportError:  # pragma: no cover - graft needs torch with FSDP2
    _FSDP2 = False  # the names above are then undefined: every use is behind this flag

ROOT_METHOD = "graft_root_call"


def available() -> bool:
    """True when this torch has FSDP2 (``fully_shard``) and ``torch.distributed``."""
    return _FSDP2 and dist.is_available()


def default_backend(device: str | torch.device) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_process_group(
    rank: int, world_size: int, master_addr: str, master_port: int, device: str = "cpu", timeout_s: float = 600.0
) -> None:
    """Join the process group of one model's workers (idempotent)."""
    if dist.is_initialized():
        return
    backend = default_backend(device)
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (PEFT-wrapped or not).

    Uses the model's ``_no_split_modules`` class names (what ``device_map`` never splits);
    falls back to the longest ``nn.ModuleList``.
    """
    base = _unwrap(model)
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__}")
    longest = max(lists, key=len)
    return list(longest)


def _root_call(self, fn: Callable, *args, **kwargs):
    return fn(*args, **kwargs)


def shard_model(
    model: nn.Module,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Apply FSDP2 to ``model`` in place over the default process group; returns it.

    ``param_dtype``/``reduce_dtype`` set a :class:`MixedPrecisionPolicy` (e.g. fp32 master
    weights computed in bf16 with fp32 gradient reduction); ``None`` keeps the parameter
    dtype. ``reshard_after_forward=False`` keeps layers gathered between forward and backward
    (faster, ZeRO-2-like memory).
    """
    if not available():
        raise RuntimeError("FSDP2 needs torch >= 2.6 with torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError("shard_model: call init_process_group first")
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    root = fully_shard(model, mp_policy=mp, reshard_after_forward=False)  # ``model`` itself, now an FSDPModule
    gloo = dist.get_backend() == "gloo"
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)  # sum over ranks: losses use the GLOBAL token count
        if gloo:
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    # A method of the root that runs any function inside the root's forward hooks.
    object.__setattr__(model, ROOT_METHOD, types.MethodType(_root_call, model))
    register_fsdp_forward_method(model, ROOT_METHOD)
    root._get_fsdp_state()._lazy_init()  # the root is the root, whichever module runs first
    return model


def is_sharded(model: nn.Module) -> bool:
    return _FSDP2 and isinstance(model, FSDPModule)


def fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def root_call(model: nn.Module, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` inside the root unit's forward (all-gathers the root parameters,
    registers the backward reduce-scatter); plain call for an unsharded model."""
    if is_sharded(model):
        return getattr(model, ROOT_METHOD)(fn, *args, **kwargs)
    return fn(*args, **kwargs)


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Keep every unit of a sharded model unsharded inside the block (no-grad inference).

    Entering and leaving are collectives (every rank must enter); inside, forwards run
    without communication, so ranks can process different amounts of data.
    """
    if not is_sharded(model):
        yield
        return
    assert isinstance(model, FSDPModule)  # what is_sharded() checked
    mods = fsdp_modules(model)
    layers = [m for m in mods if m is not model]
    for m in mods:
        m.unshard()
    for m in layers:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        with torch.no_grad():
            yield
    finally:
        for m in layers:
            m.set_reshard_after_forward(True, recurse=False)
        model.reset_iter_state()  # drop the per-forward bookkeeping of the inference passes
        for m in mods:
            m.reshard()


def dummy_backward(model: nn.Module, fn: Callable[[], torch.Tensor]) -> None:
    """One forward/backward that contributes exactly zero gradient (keeps collectives matched
    on a rank that has run out of micro-batches)."""
    out = root_call(model, fn)
    (out * 0.0).sum().backward()


_NORM_CHUNK = 1 << 22
"""Gradient entries squared per float64 chunk in :func:`grad_norm` (32 MiB of float64 at a time)."""


def grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of the gradients, accumulated in float64 (a 0-dim float64 tensor).

    Sharded (DTensor) gradients: each rank sums the squares of its shards, then one all-reduce.
    In float64 the result does not depend on how the sum is split, so after rounding to
    float32 it is the same in one process and over any number of ranks -- which keeps the
    clipping coefficient, and so the whole optimiser step, identical between backends."""
    sharded = False
    parts = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if _FSDP2 and isinstance(g, DTensor):
            sharded = True
            g = g.to_local()
        flat = g.detach().reshape(-1)
        for i in range(0, flat.numel(), _NORM_CHUNK):  # never a float64 copy of a whole 168M-entry embedding
            parts.append(flat[i : i + _NORM_CHUNK].double().pow_(2).sum())
    dev = parts[0].device if parts else torch.device("cpu")
    sq = torch.stack(parts).sum() if parts else torch.zeros((), dtype=torch.float64, device=dev)
    if sharded and dist.is_initialized():
        dist.all_reduce(sq)
    return sq.sqrt()


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> float:
    """:func:`grad_norm`, then scale gradients to ``max_norm`` when ``max_norm > 0`` (as
    ``torch.nn.utils.clip_grad_norm_``). Returns the norm before clipping."""
    params = [p for p in params if p.grad is not None]
    total = grad_norm(params)
    if max_norm > 0 and params:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.float())
    return float(total)


def any_rank(flag: bool, device: str | torch.device = "cpu") -> bool:
    """``flag`` or'ed over the ranks of the process group (one all-reduce); ``flag`` itself without a group."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


# ----------------------------------------------------------------------------- state


def _full(v: Any) -> Any:
    if _FSDP2 and isinstance(v, DTensor):
        v = v.full_tensor()
    return v.detach().cpu() if torch.is_tensor(v) else v


def full_state_dict(model: nn.Module, rank: int) -> dict[str, torch.Tensor] | None:
    """Full (unsharded) CPU state dict on rank 0, ``None`` elsewhere. Collective."""
    out = {}
    for k, v in model.state_dict().items():
        v = _full(v)
        if rank == 0:
            out[k] = v
    return out if rank == 0 else None


def iter_full_parameters(model: nn.Module, device: str | torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter, one at a time (weight push to a rollout engine).
    Collective for a sharded model: every rank must consume the whole iterator."""
    for name, p in model.named_parameters():
        v = p.detach()
        if _FSDP2 and isinstance(v, DTensor):
            v = v.full_tensor()
        yield name, (v.to(device) if device is not None else v)


def gather_optimizer_state(optimizer: torch.optim.Optimizer, rank: int) -> dict | None:
    """``optimizer.state_dict()`` with full tensors, on rank 0 (``None`` elsewhere). Collective.

    The result has the same integer-keyed layout as an unsharded optimizer's, so it loads
    into either backend."""
    sd = optimizer.state_dict()
    state = {}
    for idx in sorted(sd["state"]):
        state[idx] = {k: _full(v) for k, v in sd["state"][idx].items()}
    return {"state": state, "param_groups": sd["param_groups"]} if rank == 0 else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, full: dict) -> None:
    """Load a full (unsharded-layout) optimizer state into an optimizer over DTensor shards.

    Every rank passes the same ``full``; each keeps its own shard (no communication)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {}
    for idx, entry in full["state"].items():
        p = params[int(idx)]
        e = {}
        for k, v in entry.items():
            if _FSDP2 and isinstance(p, DTensor) and torch.is_tensor(v) and tuple(v.shape) == tuple(p.shape):
                v = distribute_tensor(
                    v.to(device=p.device_mesh.device_type, dtype=p.dtype), p.device_mesh, p.placements, src_data_rank=None
                )
            e[k] = v
        state[idx] = e
    optimizer.load_state_dict({"state": state, "param_groups": full["param_groups"]})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """This node's address as Ray sees it (inside a Ray worker), else ``MASTER_ADDR`` or localhost."""
    ray = sys.modules.get("ray")  # only a process that imported Ray can be inside a Ray cluster
    try:
        if ray is not None:
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - not connected
        pass
    return os.environ.get("MASTER_ADDR", "127.0.0.1")
