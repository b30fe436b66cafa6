"""AdamW whose step needs no parameter-sized temporaries: torch's fused kernel where it applies, else a chunked step.

:func:`make_adamw` gives plain parameters on a CPU or CUDA device torch's fused AdamW (``fused=True``: one pass
over parameter, gradient and both moments; on the default job's Gemma-3 0.15 s a step instead of 0.43 s,
``benchmarks/results/update-head-gradient/``), which rounds a little differently from the single-tensor path; FSDP2 shards
(``DTensor``) and other devices get :class:`LeanAdamW`'s chunked single-tensor step. Both keep torch's
``state_dict`` layout, so a checkpoint written with either resumes with either (the kernel is this process's
choice, not the checkpoint's: :meth:`LeanAdamW.load_state_dict`).

torch's single-tensor AdamW (the path it takes on CPU) computes ``denom = (v.sqrt() / c2).add_(eps)``
for a whole parameter at once: two temporaries of the parameter's size exist at the same moment.
For Gemma-3-270M's tied 262k x 640 embedding that is 1.25 GiB on top of weights, gradients and
moments, at the moment memory peaks (measured: peak RSS of one step 5.73 vs 4.48 GiB before it).
:class:`LeanAdamW` runs exactly the same element-wise operations in the same order, on slices of
at most :data:`CHUNK` elements, so its parameters and states equal torch's bit for bit
(``tests/policy/test_optim.py``) and its ``state_dict`` is torch's.
"""

from __future__ import annotations

import math

import torch
from torch.optim.optimizer import _get_scalar_dtype

from graft.registry import LR_SCHEDULES

CHUNK = 1 << 22
"""Elements per slice of the denominator (16 MiB in fp32); a multiple of every SIMD width."""
KERNEL_FLAGS = ("fused", "foreach")
"""Parameter-group entries that pick AdamW's implementation, not its arithmetic: kept across ``load_state_dict``."""
FUSED_DEVICES = ("cpu", "cuda")
"""Devices whose plain parameters take torch's fused AdamW kernel (:func:`make_adamw`)."""


def make_adamw(params: list[torch.nn.Parameter], lr: float, betas: tuple[float, float], weight_decay: float) -> "LeanAdamW":
    """AdamW over ``params``: torch's fused kernel when every one is a plain floating tensor on a
    :data:`FUSED_DEVICES` device, else the chunked single-tensor step (FSDP2's ``DTensor`` shards)."""
    fused = all(
        type(p) in (torch.Tensor, torch.nn.Parameter) and p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params
    )
    return LeanAdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of an FSDP2 ``DTensor`` (element-wise ops act on it alone), else ``t``."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


class LeanAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (default flags, single-tensor path) with a chunked denominator.

    Non-default flags (amsgrad, maximize, foreach, fused, capturable, differentiable) fall back to
    torch's own step: ``fused=True`` is torch's fused kernel (:func:`make_adamw`).
    """

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, but each group keeps this optimiser's :data:`KERNEL_FLAGS`: the saved moments, steps and
        hyper-parameters are loaded; the implementation that steps them stays the one this process chose."""
        kernel = [{k: g.get(k) for k in KERNEL_FLAGS} for g in self.param_groups]
        groups = [{**saved, **flags} for saved, flags in zip(state_dict["param_groups"], kernel, strict=True)]
        super().load_state_dict({**state_dict, "param_groups": groups})

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None or any(self._unsupported(g) for g in self.param_groups):
            return super().step(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd, eps = float(group["lr"]), group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("LeanAdamW does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                param, grad = _local(p), _local(p.grad)
                m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                state["step"] += 1
                if wd != 0:
                    param.mul_(1 - lr * wd)
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = state["step"].item()
                step_size = lr / (1 - beta1**step)
                c2 = (1 - beta2**step) ** 0.5
                _apply(param, m, v, c2, eps, -step_size)
        return None

    @staticmethod
    def _unsupported(group: dict) -> bool:
        return (
            any(group.get(k) for k in ("amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable"))
            or not group.get("decoupled_weight_decay", True)
            or torch.is_tensor(group["lr"])
        )


def _apply(param: torch.Tensor, m: torch.Tensor, v: torch.Tensor, c2: float, eps: float, value: float) -> None:
    """param += value * m / (sqrt(v) / c2 + eps), slice by slice."""
    if (
        param.numel() <= CHUNK
        or not (param.is_contiguous() and m.is_contiguous() and v.is_contiguous())
        or torch.is_complex(param)
    ):
        param.addcdiv_(m, (v.sqrt() / c2).add_(eps), value=value)
        return
    fp, fm, fv = param.view(-1), m.view(-1), v.view(-1)
    for i in range(0, fp.numel(), CHUNK):
        sl = slice(i, i + CHUNK)
        fp[sl].addcdiv_(fm[sl], (fv[sl].sqrt() / c2).add_(eps), value=value)


def scheduled_lr(lr: float, schedule: str, warmup: int, step: int, horizon: int) -> float:
    """The learning rate of training step ``step`` (1-based) of a schedule over ``horizon`` steps
    (``models.I.lr_schedule``, ``models.I.lr_horizon``; a function of these alone, so a resumed run follows it):
    ``lr * step / warmup`` while ``step <= warmup``, then ``lr`` (``constant``), ``lr * (1 - p)`` (``linear``) or
    ``lr * (1 + cos(pi p)) / 2`` (``cosine``) with ``p = min(1, (step - warmup - 1) / (horizon - warmup))``: full
    ``lr`` on the first step after warm-up, never 0 on the horizon's last step, 0 (``linear``, ``cosine``) after it."""
    if step <= warmup:
        return lr * step / warmup
    factor = LR_SCHEDULES[schedule](min(1.0, (step - warmup - 1) / max(1, horizon - warmup)))
    return lr if factor == 1.0 else lr * factor  # the configured float itself at full rate


@LR_SCHEDULES.register("constant")
def constant_schedule(p: float) -> float:
    """``constant``: the factor of ``lr`` at progress ``p`` in [0, 1] after warm-up (:func:`scheduled_lr`) is 1."""
    return 1.0


@LR_SCHEDULES.register("linear")
def linear_schedule(p: float) -> float:
    """``linear``: 1 - p."""
    return 1.0 - p


@LR_SCHEDULES.register("cosine")
def cosine_schedule(p: float) -> float:
    """``cosine``: (1 + cos(pi p)) / 2."""
    return 0.5 * (1.0 + math.cos(math.pi * p))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group of ``optimizer`` steps with ``lr`` from now on."""
    for group in optimizer.param_groups:
        group["lr"] = lr
