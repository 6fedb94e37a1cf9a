"""The forward-width guarantee on a GPU or TPU, in bfloat16 (the ``accelerator`` tier).

Speculative decoding (a draft model, γ = 3, coupled verification) emits plain
decoding's tokens at the same forward width W = γ + 1, row for row, with half the rows
greedy and half at temperature 1, for the bundled pair (its trained weights) and for
random weights of the real pair's shapes (Qwen2.5-Coder-1.5B target, 0.5B draft,
``scripts/benchmarks/pair_configs``). The random pair's flat logits are full of
near-ties, which makes it the harder case. On a CPU the same guarantee is the fast
tier's (`tests/test_numerics.py`); here it runs on the accelerator's kernels.

    pytest -m accelerator tests/test_accelerator.py   # on a machine with a GPU or TPU
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import specjax
from specjax.io.hf_config import config_from_hf
from specjax.models import Model

pytestmark = [
    pytest.mark.accelerator,
    pytest.mark.skipif(
        jax.default_backend() == "cpu",
        reason="the accelerator tier needs a GPU or TPU; jax sees only a CPU here "
        "(the CPU's forward-width checks are tests/test_numerics.py)",
    ),
]

GAMMA = 3
WIDTH = GAMMA + 1
TOKENS = 64
CONFIGS = Path(__file__).resolve().parent.parent / "scripts" / "benchmarks" / "pair_configs"


def bundled_pair():
    target, draft, tokenizer = specjax.default_pair(jnp.bfloat16)
    texts = ["def fibonacci(n):", "import os\n\ndef main():", "class Stack:", "for i in "]
    return target, draft, [tokenizer.encode(t).ids for t in texts]


def random_real_shapes():
    def load(name):
        config = config_from_hf(json.loads((CONFIGS / f"{name}.json").read_text()))
        return Model.random(config, seed=0, dtype=jnp.bfloat16)

    prompts = [[(i * 7919 + 13 * r) % 50000 + 10 for i in range(40)] for r in range(4)]
    return load("qwen2.5-coder-1.5b"), load("qwen2.5-coder-0.5b"), prompts


@pytest.mark.parametrize("pair", [bundled_pair, random_real_shapes], ids=lambda f: f.__name__)
def test_speculative_equals_plain_at_its_forward_width(pair):
    target, draft, prompts = pair()
    temperature = jnp.array([0.0, 1.0] * (len(prompts) // 2))
    kw = dict(
        max_new_tokens=TOKENS,
        sampling=specjax.SamplingConfig(temperature=temperature),
        forward_width=WIDTH,
    )
    key = jax.random.key(0)
    plain = specjax.generate(key, target, prompts, **kw).to_lists()
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    spec = specjax.speculative_generate(
        key, target, drafter, prompts, verification="coupled", **kw
    ).to_lists()
    for row, (want, got) in enumerate(zip(plain, spec, strict=True)):
        parted = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
        assert want == got, (
            f"{jax.devices()[0].device_kind}, row {row} (T = {float(temperature[row])}): "
            f"speculative decoding parts from plain decoding at W = {WIDTH} at token {parted}"
        )
