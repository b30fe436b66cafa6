"""FSDP2 over 2 gloo ranks equals one process: gradients, inference, saved weights, optimizer state.

Both ranks load the same tiny Llama (real SmolLM2 tokenizer), shard it with
:func:`graft.policy.fsdp.shard_model`, and each computes the GRAFT policy loss of HALF
a batch normalised by the GLOBAL token count. The summed (reduce-scattered) gradients must
equal the gradients of one process on the whole batch.
"""
from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from graft.algos.losses import policy_loss
from graft.config import ModelConfig
from graft.policy import fsdp
from graft.policy.sampling import SamplingParams
from tests.patience import patient


def _batch(equal_lengths: bool):
    g = torch.Generator().manual_seed(0)
    pl = (5, 5, 5, 5) if equal_lengths else (5, 7, 3, 6)
    rl = (4, 4, 4, 4) if equal_lengths else (4, 2, 6, 3)
    prompts = [[int(x) for x in torch.randint(10, 1000, (n,), generator=g)] for n in pl]
    resps = [[int(x) for x in torch.randint(10, 1000, (n,), generator=g)] for n in rl]
    return prompts, resps


ADV = [1.0, -0.5, 0.7, -1.2]


def _loss(policy, prompts, resps, adv, num_tokens, call):
    logp, mask = call(policy.forward_logprobs, prompts, resps, chunk=4)
    old = logp.detach() - 0.05 * mask            # ratios != 1 so clipping paths are live
    b = len(prompts)
    loss, _ = policy_loss(logp=logp, old_logp=old, advantages=torch.tensor(adv), weights=torch.ones(b), mask=mask,
                          is_peer=torch.zeros(b, dtype=torch.bool), clip_low=0.2, clip_high=0.28, agg="token-mean",
                          num_tokens=num_tokens)
    return loss


def _worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    try:
        from graft.policy.policy import Policy

        torch.set_num_threads(1)
        fsdp.init_process_group(rank, world, "127.0.0.1", port, device="cpu", timeout_s=patient(120))
        pol = Policy.load(ModelConfig(name="A", path=model_dir))
        fsdp.shard_model(pol.model)
        call = lambda f, *a, **k: fsdp.root_call(pol.model, f, *a, **k)  # noqa: E731
        mine = slice(0, 2) if rank == 0 else slice(2, 4)
        grads = {}
        for equal in (True, False):
            prompts, resps = _batch(equal)
            n_tok = float(sum(len(r) for r in resps))            # GLOBAL token count
            pol.model.zero_grad(set_to_none=True)
            _loss(pol, prompts[mine], resps[mine], ADV[mine], n_tok, call).backward()
            grads[equal] = {n: fsdp._full(p.grad) for n, p in pol.model.named_parameters()}
        # inference inside gathered(): different amounts of work per rank, no collectives inside
        prompts, resps = _batch(False)
        with fsdp.gathered(pol.model):
            samples = pol.generate([prompts[rank]] * (1 + rank), SamplingParams(n=2, max_new_tokens=3 + 2 * rank, seed=5))
            lps = pol.token_logprobs(prompts[: 1 + 2 * rank], resps[: 1 + 2 * rank])
        # a training step after inference still works; then optimizer state round trip and saving
        opt = pol.make_optimizer()
        pol.model.zero_grad(set_to_none=True)
        _loss(pol, prompts[mine], resps[mine], ADV[mine], float(sum(len(r) for r in resps)), call).backward()
        norm = fsdp.clip_grad_norm_([p for p in pol.model.parameters()], 1.0)
        opt.step()
        full_opt = fsdp.gather_optimizer_state(opt, rank)
        state = fsdp.full_state_dict(pol.model, rank)
        if rank == 0:
            from graft.trainer.workers import _save_full
            _save_full(pol, state, os.path.join(os.path.dirname(out), "saved"))
        # the gathered (rank-0) optimizer state, loaded into a fresh sharded optimizer, gives the same shards
        box = [full_opt]
        torch.distributed.broadcast_object_list(box, src=0)
        opt2 = pol.make_optimizer()
        fsdp.load_optimizer_state(opt2, box[0])
        same = all(torch.equal(a.to_local(), b.to_local()) if hasattr(a, "to_local") else torch.equal(a, b)
                   for s1, s2 in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values())
                   for a, b in zip(s1.values(), s2.values()) if torch.is_tensor(a))
        torch.save({"grads": grads, "samples": [[s.token_ids for s in g] for g in samples],
                    "logprobs": [lp.tolist() for lp in lps], "norm": norm, "opt": full_opt, "opt_roundtrip": same,
                    "state": state}, f"{out}.{rank}")
        fsdp.destroy_process_group()
    except BaseException:
        with open(f"{out}.{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise


@pytest.mark.slow   # ~70 s on 2 shared cores: two spawned ranks import torch + transformers
def test_two_gloo_ranks_match_one_process(tmp_path, tiny_llama_dir):
    from graft.policy.policy import Policy

    out = str(tmp_path / "res")
    ctx = mp.get_context("spawn")
    port = fsdp.free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, tiny_llama_dir, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=patient(240))
    errs = [open(f"{out}.{r}.err").read() for r in range(2) if os.path.exists(f"{out}.{r}.err")]
    assert not errs, "\n".join(errs)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    res = [torch.load(f"{out}.{r}") for r in range(2)]

    torch.manual_seed(0)
    ref = Policy.load(ModelConfig(name="A", path=tiny_llama_dir))
    plain = lambda f, *a, **k: f(*a, **k)  # noqa: E731
    for equal in (True, False):
        prompts, resps = _batch(equal)
        n_tok = float(sum(len(r) for r in resps))
        ref.model.zero_grad(set_to_none=True)
        if equal:   # the whole batch in one pass
            _loss(ref, prompts, resps, ADV, n_tok, plain).backward()
        else:       # padding differs between a 4-row and a 2-row batch (~3e-6 in fp32), so the reference
            #         runs the same two halves as micro-batches of one process (what Learner.update does)
            _loss(ref, prompts[:2], resps[:2], ADV[:2], n_tok, plain).backward()
            _loss(ref, prompts[2:], resps[2:], ADV[2:], n_tok, plain).backward()
        for name, p in ref.model.named_parameters():
            for r in range(2):
                torch.testing.assert_close(res[r]["grads"][equal][name], p.grad, atol=1e-6, rtol=0,
                                           msg=lambda m: f"{name} (equal_lengths={equal}, rank {r}): {m}")

    # inference in gathered() = the unsharded model
    prompts, resps = _batch(False)
    for r in range(2):
        s = ref.generate([prompts[r]] * (1 + r), SamplingParams(n=2, max_new_tokens=3 + 2 * r, seed=5))
        assert [[x.token_ids for x in g] for g in s] == res[r]["samples"]
        lps = ref.token_logprobs(prompts[: 1 + 2 * r], resps[: 1 + 2 * r])
        for a, b in zip(lps, res[r]["logprobs"]):
            torch.testing.assert_close(a, torch.tensor(b), atol=1e-6, rtol=0)

    # the saved folder loads as a plain model with the gathered weights (architecture name restored)
    import json
    saved = tmp_path / "saved"
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    back = Policy.load(ModelConfig(name="A", path=str(saved)))
    for k, v in back.model.state_dict().items():
        torch.testing.assert_close(v, res[0]["state"][k], atol=0, rtol=0)
    # gathered optimizer state has the unsharded layout (int keys, full shapes) and round-trips
    params = list(back.model.parameters())
    assert sorted(res[0]["opt"]["state"]) == list(range(len(params)))
    for i, p in enumerate(params):
        assert res[0]["opt"]["state"][i]["exp_avg"].shape == p.shape
    assert res[0]["opt_roundtrip"] and res[1]["opt_roundtrip"]
    assert res[0]["norm"] == pytest.approx(res[1]["norm"], rel=0, abs=0)
