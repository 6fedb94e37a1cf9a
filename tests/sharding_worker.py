"""Runs the sharded-decoding checks on 8 virtual CPU devices; writes a JSON report.

Started by ``tests/test_sharding.py`` in a subprocess, because the device
count is fixed when JAX starts (``XLA_FLAGS=--xla_force_host_platform_device_count=8``)
and must not leak into the rest of the suite. Runnable by hand::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python tests/sharding_worker.py /tmp/report.json

For every mesh shape it decodes the same prompts with and without sharding
(plain and speculative, greedy and sampled, same keys) and records whether
the tokens agree, plus the shardings of params and of the caches that the
jitted decode loops produce.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from support import GREEDY

import specjax
from specjax import decoding
from specjax.models import sharding
from specjax.testing import tiny_model

specjax.core.compilation_cache.enable_from_environment()  # the suite's shared cache

jax.config.update("jax_numpy_rank_promotion", "raise")

MESH_SHAPES = [(8, 1), (4, 2), (1, 8)]  # as tests/test_sharding.py's MESHES
V = 64
BATCH, PROMPT_LEN, NEW_TOKENS, CACHE_LEN, GAMMA = 8, 5, 10, 32, 3
# num_kv_heads=4 does not divide a model axis of 8: the (1, 8) mesh checks
# the error and then the documented replication fallback.
TARGET = dict(vocab_size=V, num_heads=8, num_kv_heads=4, hidden_size=32, intermediate_size=64)
DRAFT = dict(
    vocab_size=V,
    num_heads=4,
    num_kv_heads=2,
    hidden_size=16,
    intermediate_size=32,
    tie_word_embeddings=True,  # the tied [V, E] table, split by vocabulary
)
SAMPLED = specjax.SamplingConfig(temperature=1.0, top_p=0.9)


def equivalent(x, mesh, spec) -> bool:
    return x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim)


def spec_str(x) -> str:
    return str(getattr(x.sharding, "spec", x.sharding))


def loop_states(target, drafter, prompts, sampling):
    """The final DecodeState of plain and speculative decoding, through the open loop.

    init and decoding.run run the same loop body as generate()/speculative_generate().
    """
    key = jax.random.key(0)
    kw = dict(max_new_tokens=NEW_TOKENS, sampling=sampling, cache_len=CACHE_LEN)

    def run(**drafter):
        decoder, state = decoding.init(key, target, prompts, **drafter, **kw)
        return decoding.run(decoder, state)

    return run(), run(drafter=drafter)


def decode_all(target, draft, prompts):
    """Tokens of plain/speculative x greedy/sampled decoding, same keys throughout."""
    out = {}
    drafter = specjax.DraftModel(draft, num_draft=GAMMA)
    for name, sampling in (("greedy", GREEDY), ("sampled", SAMPLED)):
        kw = dict(max_new_tokens=NEW_TOKENS, sampling=sampling, cache_len=CACHE_LEN)
        key = jax.random.key(0)
        out[f"generate_{name}"] = np.asarray(specjax.generate(key, target, prompts, **kw).tokens)
        out[f"speculative_{name}"] = np.asarray(
            specjax.speculative_generate(key, target, drafter, prompts, **kw).tokens
        )
    return out


def check_mesh(shape, target, draft, prompts, reference):
    mesh = sharding.make_mesh(*shape)
    data_n, model_n = shape
    rec = {"shape": list(shape)}
    t0 = time.perf_counter()
    indivisible = "raise"
    if TARGET["num_kv_heads"] % model_n:
        try:
            sharding.shard_model(target, mesh)
            rec["default_error"] = None
        except ValueError as e:
            rec["default_error"] = str(e)
        indivisible = "replicate"
    kv_split = TARGET["num_kv_heads"] % model_n == 0
    draft_tp = DRAFT["num_kv_heads"] % model_n == 0
    st = sharding.shard_model(target, mesh, indivisible=indivisible)
    sd = sharding.shard_model(draft, mesh, tensor_parallel=draft_tp)
    rec["replicated"] = list(st.replicated)
    rec["draft_tensor_parallel"] = draft_tp
    sharded_prompts = sharding.shard_prompts(prompts, mesh)

    # Params placed as the rules say, and really split into smaller shards.
    layer = "layers/0"
    p = st.params
    att, mlp = p["layers"][0]["self_attn"], p["layers"][0]["mlp"]
    kv = "model" if kv_split else None
    expected = {
        f"{layer}/self_attn/q_proj/weight": (att["q_proj"]["weight"][...], P("model", None)),
        f"{layer}/self_attn/k_proj/weight": (att["k_proj"]["weight"][...], P(kv, None)),
        f"{layer}/self_attn/v_proj/weight": (att["v_proj"]["weight"][...], P(kv, None)),
        f"{layer}/self_attn/o_proj/weight": (att["o_proj"]["weight"][...], P(None, "model")),
        f"{layer}/mlp/gate_proj/weight": (mlp["gate_proj"]["weight"][...], P("model", None)),
        f"{layer}/mlp/down_proj/weight": (mlp["down_proj"]["weight"][...], P(None, "model")),
        "embed_tokens/embedding": (p["embed_tokens"]["embedding"][...], P("model", None)),
        "lm_head/weight": (p["lm_head"]["weight"][...], P("model", None)),
        "norm/weight": (p["norm"]["weight"][...], P()),
    }
    rec["params_ok"] = {k: equivalent(x, mesh, s) for k, (x, s) in expected.items()}
    rec["params_spec"] = {k: spec_str(x) for k, (x, _) in expected.items()}
    q = att["q_proj"]["weight"][...]
    rec["q_shard_shape"] = list(q.addressable_shards[0].data.shape)
    rec["q_shape"] = list(q.shape)
    draft_q = sd.params["layers"][0]["self_attn"]["q_proj"]["weight"][...]
    rec["draft_q_ok"] = equivalent(draft_q, mesh, P("model" if draft_tp else None, None))
    draft_embed = sd.params["embed_tokens"]["embedding"][...]  # tied: [V, E], vocab split
    rec["draft_embed_ok"] = equivalent(draft_embed, mesh, P("model" if draft_tp else None, None))
    rec["prompts_ok"] = equivalent(sharded_prompts, mesh, P("data"))

    # Caches: built under jit, and as they come out of the decode loops.
    cache_spec = P(None, "data", kv, None, None)
    draft_cache_spec = P(None, "data", "model" if draft_tp else None, None, None)
    cache = jax.jit(lambda m: m.init_cache(BATCH, CACHE_LEN))(st)
    rec["init_cache_ok"] = equivalent(cache.k, mesh, cache_spec) and equivalent(
        cache.lengths, mesh, P("data")
    )
    rec["init_cache_spec"] = spec_str(cache.k)

    out = decode_all(st, sd, sharded_prompts)
    rec["match"] = {k: bool(np.array_equal(v, reference[k])) for k, v in out.items()}
    plain, spec = loop_states(st, specjax.DraftModel(sd, num_draft=GAMMA), sharded_prompts, GREEDY)
    rec["loop_cache_ok"] = {
        "generate_target": equivalent(plain.target_cache.k, mesh, cache_spec),
        "speculative_target": equivalent(spec.target_cache.k, mesh, cache_spec),
        "speculative_draft": equivalent(spec.drafter_state.k, mesh, draft_cache_spec),
        "lengths": equivalent(spec.target_cache.lengths, mesh, P("data")),
    }
    rec["loop_cache_spec"] = {
        "target": spec_str(spec.target_cache.k),
        "draft": spec_str(spec.drafter_state.k),
    }
    rec["split_write_equal"] = check_split_write(mesh, cache_spec)
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


def check_split_write(mesh, cache_spec) -> bool:
    """`write_rows` of a cache split over ``mesh`` (each chip writing its own rows, as
    under a `ShardedModel`) equals the scatter of the whole cache, rows near and past
    its end included."""
    from specjax.models.attention import split_cache_writes, write_kv, write_rows

    rng = np.random.default_rng(0)
    layers, heads, dim, slots, tokens = 2, TARGET["num_kv_heads"], 4, 12, 3
    k = rng.standard_normal((layers, BATCH, heads, dim, slots)).astype(np.float32)
    v = rng.standard_normal((layers, BATCH, heads, slots, dim)).astype(np.float32)
    start = rng.integers(0, slots + 2, size=BATCH).astype(np.int32)
    new_k = rng.standard_normal((BATCH, tokens, heads, dim)).astype(np.float32)
    new_v = rng.standard_normal((BATCH, tokens, heads, dim)).astype(np.float32)
    at = start[:, None] + np.arange(tokens)[None]
    want = jax.jit(write_kv, static_argnums=2)(k, v, 1, at, new_k, new_v)
    placed = [jax.device_put(x, NamedSharding(mesh, cache_spec)) for x in (k, v)]

    @jax.jit
    def split(k, v, start, new_k, new_v):
        with split_cache_writes(mesh, cache_spec):
            return write_rows(k, v, 1, start, new_k, new_v)

    got = split(*placed, start, new_k, new_v)
    return all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


def check_errors(target, prompts):
    """Batch sizes that do not divide the data axis fail with a clear message."""
    mesh = sharding.make_mesh(4, 2)
    st = sharding.shard_model(target, mesh)
    errors = {}
    for name, fn in {
        "shard_prompts_batch": lambda: sharding.shard_prompts(prompts[:6], mesh),
        "cache_batch": lambda: specjax.generate(
            jax.random.key(0), st, prompts[:6], max_new_tokens=2, cache_len=CACHE_LEN
        ),
        "ragged": lambda: sharding.shard_prompts([[1, 2], [3]], mesh),
        "axis_name": lambda: sharding.shard_model(target, mesh, model_axis="tp"),
    }.items():
        try:
            fn()
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    replicate = sharding.shard_model(target, mesh, indivisible="replicate")
    errors["replicated_batch_spec"] = spec_str(
        jax.jit(lambda m: m.init_cache(6, CACHE_LEN))(replicate).k
    )
    return errors


def main(path):
    t0 = time.perf_counter()
    target = tiny_model(seed=0, init_scale=8.0, **TARGET)
    draft = tiny_model(seed=1, init_scale=8.0, **DRAFT)
    prompts = np.asarray(jax.random.randint(jax.random.key(1), (BATCH, PROMPT_LEN), 0, V))
    report = {"devices": len(jax.devices())}
    reference = decode_all(target, draft, jnp.asarray(prompts))
    report["reference_seconds"] = round(time.perf_counter() - t0, 1)
    report["meshes"] = {
        f"{d}x{m}": check_mesh((d, m), target, draft, prompts, reference) for d, m in MESH_SHAPES
    }
    report["errors"] = check_errors(target, prompts)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
