#!/usr/bin/env python
"""Sharded speculative decoding on one host or across many (TPU pods, GPU clusters).

On one host it runs as it is, on whatever devices JAX sees::

    python scripts/examples/multihost.py                     # every device on the data axis
    python scripts/examples/multihost.py --model-axis 2      # 2-way tensor parallel

To try an 8-device mesh on a CPU-only machine::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python scripts/examples/multihost.py --model-axis 2 --tiny

On a TPU pod slice, run the same command on every host at once with
``--multihost``; ``jax.distributed.initialize()`` then finds the coordinator
and the process ids by itself::

    gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all \\
        --command="python scripts/examples/multihost.py --multihost --model-axis 4"

On GPU clusters under SLURM (or Open MPI) the same auto-detection works. Elsewhere
pass ``--coordinator HOST:PORT --num-processes N --process-id I`` to each process.

Every process must make the same calls with the same values: the same
checkpoint (or seed), the same prompts and the same key. Each process then
holds only its own shards of the global arrays. Output is gathered with
``multihost_utils.process_allgather`` and printed by process 0.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multihost", action="store_true", help="jax.distributed.initialize()")
    parser.add_argument("--coordinator", help="HOST:PORT of process 0 (if not auto-detected)")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--model-axis", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--batch-per-device", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="random tiny models instead of the bundled pair (no tokenizer, no assets)",
    )
    return parser.parse_args(argv)


def initialize(args) -> None:
    """Joins the processes into one JAX runtime; must run before any other JAX call."""
    if not (args.multihost or args.coordinator):
        return  # one host: nothing to do
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )


def load_models(args):
    import specjax

    if args.tiny:
        cfg = dict(vocab_size=256, num_heads=8, num_kv_heads=4, hidden_size=64)
        target = specjax.testing.tiny_model(seed=0, init_scale=8.0, **cfg)
        draft = specjax.testing.tiny_model(seed=1, init_scale=8.0, num_layers=1, **cfg)
        return target, draft, None
    return specjax.default_pair()


def main(argv=None):
    args = parse_args(argv)
    initialize(args)

    from jax.experimental import multihost_utils

    import specjax
    from specjax.models import sharding

    lead = jax.process_index() == 0
    say = print if lead else (lambda *a, **k: None)
    say(
        f"processes: {jax.process_count()}, devices: {jax.device_count()} global / "
        f"{jax.local_device_count()} local ({jax.devices()[0].platform})"
    )

    mesh = sharding.make_mesh(data=-1, model=args.model_axis)
    say(f"mesh: {dict(mesh.shape)}")
    target, draft, tokenizer = load_models(args)
    # The target is split over the model axis; the small draft is replicated
    # (tensor parallelism would cost more in collectives than it saves).
    target = sharding.shard_model(target, mesh, indivisible="replicate")
    draft = sharding.shard_model(draft, mesh, tensor_parallel=False)
    if target.replicated:
        say(f"replicated (dimension does not divide the model axis): {target.replicated}")

    batch = args.batch_per_device * mesh.shape["data"]
    if tokenizer is not None:
        texts = ["def fibonacci(n):\n", "import os\n\n\ndef ", "class Stack:\n    def "]
        rows = [tokenizer.encode(texts[i % len(texts)]).ids for i in range(batch)]
        width = min(len(r) for r in rows)
        prompts = np.asarray([r[:width] for r in rows], np.int32)  # equal length: shardable
    else:
        prompts = np.random.default_rng(0).integers(0, target.vocab_size, (batch, 8), np.int32)
    # Every process passes the same global prompts; each builds only its own rows.
    prompts = sharding.shard_prompts(prompts, mesh)

    sampling = specjax.SamplingConfig(temperature=args.temperature)
    drafter = specjax.DraftModel(draft, num_draft=args.num_draft)
    key = jax.random.key(0)
    kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling)
    for name, run in (
        ("plain", lambda: specjax.generate(key, target, prompts, **kw)),
        ("speculative", lambda: specjax.speculative_generate(key, target, drafter, prompts, **kw)),
    ):
        run()  # compile
        start = time.perf_counter()
        out = run()
        jax.block_until_ready(out.tokens)
        seconds = time.perf_counter() - start
        # Global arrays may span other hosts' devices: gather before reading.
        tokens, lengths = multihost_utils.process_allgather((out.tokens, out.lengths), tiled=True)
        tokens_per_call = float(out.tokens_per_call)  # a replicated scalar: every host has it
        say(
            f"{name:>11}: {int(np.sum(lengths))} tokens in {seconds:.3f}s, "
            f"{tokens_per_call:.2f} tokens per target call"
        )
        first = tokens[0, : lengths[0]].tolist()
        say("             row 0:", repr(tokenizer.decode(first)) if tokenizer else first)


if __name__ == "__main__":
    main()
