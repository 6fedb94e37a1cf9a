"""The base layer: checks of arguments, jit keyed by dataclass types, timing, the cache.

Nothing here knows about models or decoding; every other layer may import it.
"""
