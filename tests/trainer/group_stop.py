"""A run stopped the way a cluster stops it -- SIGTERM to its whole process group -- at a chosen step and phase
(tests/trainer/test_group_stop.py). Installed in a runner process that is the leader of a group of its own
(``start_new_session``), so the signal reaches the trainer and every worker it started, and nothing else.

``install(kind, where)`` with ``where`` ``"PHASE:STEP:SIGNAL"`` or ``"PHASE:STEP:SIGNAL:tree"`` (or empty: no signal);
``tree``: the signal goes to every process descended from the runner instead (what Slurm and systemd do: every
process of the job's cgroup, beyond its group; emulated by walking /proc), in the score phase 0.1 s after a sandboxed
program started:

- ``rollout`` / ``update``: the trainer signals its group as the phase of that step begins;
- ``score``: the signal arrives while the grader's workers hold the step's items: for ``function`` and ``domain``
  the reward code itself sends it from its worker mid-call (a trigger file the trainer writes as the phase begins),
  for ``code`` a timer in the trainer sends it while sandboxed programs run (each sleeps 0.3 s, one worker, four a
  step).

``kind`` ``code`` also makes every response a program (two of them, by sample), so that the sandbox runs: the tiny
random models write no code; ``code_default`` the same programs after restoring SIGTERM's default action (a program
may: the stop then kills it, unless graft grades it again). Every kind's rewards differ within a group, so each
step's update moves the weights.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

PASSES = "```python\nimport time\ndef f(x):\n    return x\ntime.sleep(0.3)\n```"
FAILS = "```python\nimport time\ndef f(x):\n    return x + 1\ntime.sleep(0.3)\n```"
DEFAULT = "```python\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n"

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
    code = ["reward.domain=code", f"data.train={folder / 'code.jsonl'}", "reward.timeout_s=6", "reward.workers=1",
            "rollout.n=2"]
    return {
        "function": [f"reward.function=[{folder / 'stop_reward.py'}:score]"],
        "domain": [f"reward.domain={folder / 'stop_domain.py'}:TOY"],
        "code": code,
        "code_default": code,
    }


def _signal_group(name: str) -> None:
    os.killpg(os.getpgrp(), getattr(signal, name))


def _tree() -> tuple[list[int], dict[int, list[int]]]:
    """This process and every process descended from it (a snapshot of /proc), and each one's children."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(parent, []).append(int(pid))
    tree, todo = [], [os.getpid()]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree, children


def _program_runs() -> bool:
    """Whether a sandbox's harness (``python -I -S -B``) in this process's tree has forked the program's process."""
    tree, children = _tree()
    for pid in tree:
        try:
            harness = b"\0-I\0-S\0-B\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if harness and children.get(pid):
            return True
    return False


def _signal_tree_mid_program(name: str) -> None:
    """Once a sandboxed program runs (each sleeps 0.3 s at import), 0.1 s later: :func:`_signal_tree`."""
    while not _program_runs():
        time.sleep(0.002)
    time.sleep(0.1)
    _signal_tree(name)


def _signal_tree(name: str) -> None:
    """``name`` to this process and every process descended from it (a snapshot of /proc)."""
    for pid in _tree()[0]:
        try:
            os.kill(pid, getattr(signal, name))
        except OSError:
            pass


def install(kind: str, where: str, folder: Path) -> None:
    """Patch the trainer in this process (see the module doc)."""
    from graft.trainer import learner, loop

    phase, at, sig, whom = (where.split(":") + ["", "", ""])[:4]
    step_at = int(at) if at else -1
    send = _signal_tree if whom == "tree" else _signal_group
    if kind.startswith("code"):
        passes, fails = PASSES, FAILS
        if kind == "code_default":
            passes, fails = (DEFAULT + p.removeprefix("```python\n") for p in (PASSES, FAILS))
        rollout = learner.Learner.rollout

        def programs(self, prompts, *args, **kwargs):
            groups, m = rollout(self, prompts, *args, **kwargs)
            for g in groups:
                p = int(g.prompt_id.split("-")[-1])
                g.responses = [passes if (p + i) % 2 == 0 else fails for i in range(g.size)]
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
    def in_the_score_phase() -> None:
        if not kind.startswith("code"):
            (folder / "fire").write_text(sig)
        elif whom == "tree":
            threading.Thread(target=_signal_tree_mid_program, args=(sig,)).start()
        else:
            threading.Timer(0.7, send, (sig,)).start()   # a timer fires ~2 of the 4 programs in

    fire = {
        "rollout": ("rollout_phase", lambda: send(sig)),
        "update": ("update_phase", lambda: send(sig)),
        "score": ("score_phase", in_the_score_phase),
    }
    name, before = fire[phase]
    original = getattr(loop, name)

    def phase_fn(run, *args):
        if step_now[0] == step_at:
            before()
        return original(run, *args)

    setattr(loop, name, phase_fn)
