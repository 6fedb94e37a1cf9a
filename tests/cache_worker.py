"""One small speculative decode in a fresh process, reporting what it compiled.

Run by tests/test_compilation_cache.py as ``python cache_worker.py [other-jaxlib|repair]``
with ``SPECJAX_CACHE`` set. Prints one JSON line: how many programs jax asked the
persistent cache for, how many it found there, the tokens and the warnings.
``other-jaxlib`` makes this process key its cache entries as another jaxlib
version would (jax hashes the jaxlib version into every key); ``repair`` runs the
decode under :func:`specjax.core.compilation_cache.repairing`, as the CLI does.
"""

import contextlib
import json
import sys
import warnings

import jax

events = {"requests": 0, "hits": 0}


def _count(event, **_):
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        events["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1


jax.monitoring.register_event_listener(_count)
if sys.argv[1:] == ["other-jaxlib"]:
    from jax._src import cache_key

    cache_key.jaxlib_version_str = "0.0.1+another.version"

import specjax  # noqa: E402
from specjax.core import compilation_cache  # noqa: E402
from specjax.testing import tiny_model  # noqa: E402

# As the CLI does before it runs: the cache from SPECJAX_COMPILATION_CACHE.
compilation_cache.enable_from_environment()

# "repair": the CLI's repair of unreadable entries around the run.
repair = compilation_cache.repairing() if sys.argv[1:] == ["repair"] else contextlib.nullcontext()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with repair:
        out = specjax.speculative_generate(
            jax.random.key(0),
            tiny_model(0, init_scale=20.0),
            specjax.DraftModel(tiny_model(1, init_scale=20.0), num_draft=3),
            [[1, 2, 3], [4, 5]],
            max_new_tokens=8,
            sampling=specjax.SamplingConfig.greedy(),
        )
        tokens = out.to_lists()
print(
    json.dumps(
        {
            **events,
            "cache_dir": str(compilation_cache.enabled_dir()),
            "tokens": tokens,
            "warnings": [str(w.message) for w in caught],
        }
    )
)
