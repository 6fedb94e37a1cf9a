"""Forms chosen by the platform a program is compiled for, not by the host's backend.

Some products run fastest on a CPU in a form that other platforms should not take
(`specjax.models.matmul`). The choice must follow the program's *compile target*: a
program compiled on a CPU host for a TPU or a GPU (`specjax.chips`) must take the
chip's form, and ``jax.default_backend()`` there says "cpu". `by_platform` lets jax
decide when it lowers the program, from the platform it lowers for
(``jax.lax.platform_dependent``); only the chosen form is compiled.
"""

from __future__ import annotations

from collections.abc import Callable

import jax


def by_platform(*args, cpu: Callable, other: Callable):
    """``cpu(*args)`` in a program compiled for a CPU, ``other(*args)`` elsewhere.

    Both functions must return the same shapes and dtypes; both are traced, only the
    one for the program's platform is lowered and compiled.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from specjax.core.platform import by_platform
        >>> f = jax.jit(lambda x: by_platform(x, cpu=lambda x: x + 1, other=lambda x: x - 1))
        >>> int(f(jnp.int32(0))) if jax.default_backend() == "cpu" else 1
        1
    """
    return jax.lax.platform_dependent(*args, cpu=cpu, default=other)
