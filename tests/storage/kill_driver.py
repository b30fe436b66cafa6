"""Subprocess driver for the kill test (not a test module).

Imports everything once, then, for each command line read on stdin, forks a worker that
resumes the toy run in RUN_DIR (latest checkpoint -> truncate the store -> continue) and
writes, per step, a trajectory-store file and then a checkpoint. The driver SIGKILLs the
worker as the command says and prints one ``done ...`` line for the test to check the disk.

Commands: ``random SECONDS`` (kill after that delay), ``hang_ckpt`` / ``hang_store`` (kill
while the worker is inside a checkpoint model writer / right after writing a store temp
file, before its rename), ``finish`` (let it run to the end), ``quit``.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from graft.storage import trajectory_store as ts
from graft.storage.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from graft.types import RolloutGroup

PROMPTS, G, TOKENS = 6, 4, 64


class FakeOptimizer:
    """Stands in for a torch optimizer (save_checkpoint only calls ``state_dict``): constructing a
    real one first imports torch._dynamo, seconds per process on a small CPU."""

    def __init__(self) -> None:
        self.momentum = torch.zeros(4)
        self.steps = 0

    def step(self) -> None:
        self.momentum = 0.9 * self.momentum + 1
        self.steps += 1

    def state_dict(self) -> dict:
        return {"state": {0: {"momentum_buffer": self.momentum.clone()}}, "param_groups": [{"lr": 0.1, "params": [0], "steps": self.steps}]}

    def load_state_dict(self, sd: dict) -> None:
        self.momentum = sd["state"][0]["momentum_buffer"]
        self.steps = sd["param_groups"][0]["steps"]


def groups_for(step: int) -> list[RolloutGroup]:
    out = []
    for p in range(PROMPTS):
        toks = [[(step * 7 + p * 3 + g + t) % 50 for t in range(TOKENS)] for g in range(G)]
        lps = [[-0.01 * ((step + t) % 13) for t in range(TOKENS)] for _ in range(G)]
        rewards = [float((step + p + g) % 3 == 0) for g in range(G)]
        out.append(RolloutGroup(
            prompt_id=f"p{p}", problem=f"q{p}", answer="1", source="A", holder="A", prompt_text=f"Q{p}",
            prompt_token_ids=[1], responses=[f"s{step}p{p}g{g}" for g in range(G)], token_ids=toks, old_logprobs=lps,
            gen_token_ids=toks, gen_logprobs=lps, finished=[True] * G, rewards=rewards, status=["ok"] * G,
            advantages=[r - sum(rewards) / G for r in rewards], step=step,
        ))
    return out


def worker(run: Path, total: int, mode: str, signal_fd: int) -> None:
    def hang() -> None:
        os.write(signal_fd, b"h")
        time.sleep(600)

    ck_path = latest_checkpoint(run)
    weight = torch.zeros(512, 512)  # 1 MiB "model"
    opt = FakeOptimizer()
    start = 0
    if ck_path is not None:
        ck = load_checkpoint(ck_path)
        start = ck.step + 1
        weight = load_file(ck.model_dirs["A"] / "model.safetensors")["w"]
        opt.load_state_dict(ck.optimizer_state("A"))
    store = ts.TrajectoryStore(run / "trajectories", run_id="kill-test")
    store.truncate_after(start - 1)
    if mode == "hang_store":
        real = pq.write_table

        def write_then_hang(*a, **k):
            real(*a, **k)
            a[1].flush()
            hang()
        ts.pq.write_table = write_then_hang  # same module object: the worker's next store write hangs
    for step in range(start, total):
        store.write_step(step, 0, groups_for(step), {"A": "toy-tok"})
        weight = torch.full((512, 512), float(step))
        opt.step()

        def writer(folder: Path, w=weight) -> None:
            save_file({"w": w}, folder / "model.safetensors")
            if mode == "hang_ckpt":
                hang()
            (folder / "config.json").write_text("{}")

        save_checkpoint(run, step, {"A": writer}, {"A": opt}, {"sampler": {"pos": step}}, {"total": total}, keep_last=2)


def main() -> None:
    run, total = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                worker(run, total, cmd[0], w)
            except BaseException as e:  # noqa: BLE001
                print(f"worker error: {e!r}", file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        os.close(w)
        if cmd[0] == "random":
            time.sleep(float(cmd[1]))
            os.kill(pid, signal.SIGKILL)
        elif cmd[0] in ("hang_ckpt", "hang_store"):
            if os.read(r, 1):  # empty: the worker ended without reaching the hang
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        how = "killed" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        print(f"done {how}", flush=True)


if __name__ == "__main__":
    main()
