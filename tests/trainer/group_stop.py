"""A run stopped the way a cluster stops it -- SIGTERM to its whole process group -- at a chosen step and phase
(tests/trainer/test_group_stop.py). Installed in a runner process that is the leader of a group of its own
(``start_new_session``), so the signal reaches the trainer and every worker it started, and nothing else.

``install(kind, where)`` with ``where`` ``"PHASE:STEP:SIGNAL"`` (or empty: no signal):

- ``rollout`` / ``update``: the trainer signals its group as the phase of that step begins;
- ``score``: the signal arrives while the grader's workers hold the step's items: for ``function`` and ``domain``
  the reward code itself sends it from its worker mid-call (a trigger file the trainer writes as the phase begins),
  for ``code`` a timer in the trainer sends it while sandboxed programs run (each sleeps 0.3 s, one worker, four a
  step).

``kind`` ``code`` also makes every response a program (two of them, by sample), so that the sandbox runs: the tiny
random models write no code. Every kind's rewards differ within a group, so each step's update moves the weights.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

PASSES = "```python\nimport time\ndef f(x):\n    return x\ntime.sleep(0.3)\n```"
FAILS = "```python\nimport time\ndef f(x):\n    return x + 1\ntime.sleep(0.3)\n```"

REWARD_FILE = '''
import os, signal, time
from pathlib import Path

def score(prompts, completions, **columns):
    trigger = Path(__file__).with_name("fire")
    if trigger.exists():            # the trainer wrote it (the signal's name) as the score phase began
        sig = getattr(signal, trigger.read_text())
        trigger.unlink()
        os.killpg(os.getpgrp(), sig)   # the whole group, mid-call
        time.sleep(0.5)             # this call goes on: graft's workers ignore the stop signals
    return [(len(c) % 3) / 2 for c in completions]
'''

VERIFY_FILE = '''
import os, signal, time
from pathlib import Path

def verify(response, reference):
    trigger = Path(__file__).with_name("fire")
    if trigger.exists():
        sig = getattr(signal, trigger.read_text())
        trigger.unlink()
        os.killpg(os.getpgrp(), sig)
        time.sleep(0.5)
    return (len(response) % 5) / 4, "ok"
'''

DOMAIN_FILE = '''
from graft.domains import Domain

TOY = Domain(name="stoptoy", verify_fn="stop_verify:verify", instruction="Name a toy.",
             make_reference=lambda row: "toy:" + str(row["answer"]))
'''


def write_files(folder: Path) -> dict[str, list[str]]:
    """The reward function, the user domain and the code data of the three kinds, in ``folder``; their overrides."""
    (folder / "stop_reward.py").write_text(REWARD_FILE)
    (folder / "stop_verify.py").write_text(VERIFY_FILE)
    (folder / "stop_domain.py").write_text(DOMAIN_FILE)
    rows = [f'{{"id": "c-{i}", "problem": "Write f(x) returning x ({i}).", "tests": ["assert f({i}) == {i}"]}}' for i in range(8)]
    (folder / "code.jsonl").write_text("\n".join(rows) + "\n")
    return {
        "function": [f"reward.function=[{folder / 'stop_reward.py'}:score]"],
        "domain": [f"reward.domain={folder / 'stop_domain.py'}:TOY"],
        "code": ["reward.domain=code", f"data.train={folder / 'code.jsonl'}", "reward.timeout_s=6", "reward.workers=1",
                 "rollout.n=2"],
    }


def _signal_group(name: str) -> None:
    os.killpg(os.getpgrp(), getattr(signal, name))


def install(kind: str, where: str, folder: Path) -> None:
    """Patch the trainer in this process (see the module doc)."""
    from graft.trainer import learner, loop

    phase, at, sig = (where.split(":") + ["", ""])[:3]
    step_at = int(at) if at else -1
    if kind == "code":
        rollout = learner.Learner.rollout

        def programs(self, prompts, *args, **kwargs):
            groups, m = rollout(self, prompts, *args, **kwargs)
            for g in groups:
                p = int(g.prompt_id.split("-")[-1])
                g.responses = [PASSES if (p + i) % 2 == 0 else FAILS for i in range(g.size)]
            return groups, m

        learner.Learner.rollout = programs

    step_now = [0]
    train_step = loop.train_step

    def step_fn(run, step):
        step_now[0] = step
        return train_step(run, step)

    loop.train_step = step_fn
    if step_at < 0:
        return
    fire = {
        "rollout": ("rollout_phase", lambda: _signal_group(sig)),
        "update": ("update_phase", lambda: _signal_group(sig)),
        "score": ("score_phase", lambda: threading.Timer(0.7, _signal_group, (sig,)).start() if kind == "code"
                  else (folder / "fire").write_text(sig)),   # code: a timer fires ~2 of the 4 programs in
    }
    name, before = fire[phase]
    original = getattr(loop, name)

    def phase_fn(run, *args):
        if step_now[0] == step_at:
            before()
        return original(run, *args)

    setattr(loop, name, phase_fn)
