"""``graft bench``: graft's own steps timed against references, side by side in one process.

    graft bench [--only a,b,c] [--reps 3] [--model PATH] [--models P1,P2] [--config CFG]
                [--prompts 4] [--n 8] [--max-new-tokens 48] [--threads T] [--device auto]
                [--out DIR] [--keep-balance] [--max-tries 4] [key=value ...]
    graft bench MEASUREMENT [flags]    (MEASUREMENT: train-step, rollout-phase, rollout-batch, update-precision,
                                        rollout-profile, gpu-check; :data:`graft.bench.args.MEASUREMENTS`)

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
    settings matched and the differences that remain are
    :data:`graft.bench.trl_settings.TRL_MATCHED` and :data:`~graft.bench.trl_settings.TRL_DIFFERENCES`
    (listed in that module's docstring and in ``bench.md``).
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

Modules:

- :mod:`.common`: the alternation of sides, medians, peak RSS, the environment, number formatting
- :mod:`.runs`: the configs and live Runs the parts time, one training step's timings
- :mod:`.step_vs_trl`: part (a); :mod:`.trl_settings` (TRL's settings matched to graft's, no TRL
  import) and :mod:`.trl_trainer` (the ``GRPOTrainer`` side, imported only when TRL is installed)
- :mod:`.rollout_vs_generate`: part (b)
- :mod:`.graft_vs_grpo`: part (c)
- :mod:`.report`: ``bench.md`` and the peak-RSS table (d)
- :mod:`.cli`: the comparison's input checks, parts and output files (:func:`~graft.bench.cli.run`)
- :mod:`.args`: every parser, :data:`~graft.bench.args.MEASUREMENTS` and the dispatch
  (:func:`~graft.bench.args.bench_main`), without torch
- the measurements, ``graft bench NAME`` each: :mod:`.train_step` (whole ``graft train`` steps, one process per
  run: two checkouts or override sets), :mod:`.rollout_phase` (the rollout phase two ways: threads claimed or the
  shared prefix), :mod:`.rollout_batch` (generation batch sizes), :mod:`.update_precision` (the update in fp32 and
  bf16 autocast at equal work), :mod:`.rollout_profile` (operator time per phase) and :mod:`.gpu_check` (one GRAFT
  step of a random pair on a GPU)
- :mod:`.flops`: model FLOPs per phase and this host's fp32 matmul peak
"""
