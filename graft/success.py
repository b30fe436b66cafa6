"""What a success is: a response whose reward is strictly above ``reward.success_threshold``.

The one definition every part of graft counts with: the all-fail groups (k = 0) that decide the exchange, pass@k
and the solve rates, the reward monitor, ``graft samples``/``analyze``/``eval``/``probe``. Standard library only (the
grader's worker processes import the modules that use it, without torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from torch import Tensor


@overload
def succeeded(rewards: float, threshold: float) -> bool: ...
@overload
def succeeded(rewards: Tensor, threshold: float) -> Tensor: ...
def succeeded(rewards, threshold):
    """Whether a response succeeded: its reward is strictly above ``threshold`` (``reward.success_threshold``).

    A float gives a bool, a tensor of any shape a BoolTensor of that shape. Hand-worked: rewards [0.3, 0.3] at
    threshold 0.5 -> [False, False] (an all-fail group); at 0.25 -> [True, True]; a reward equal to the threshold is
    not a success (0.5 at 0.5 -> False)."""
    return rewards > threshold
