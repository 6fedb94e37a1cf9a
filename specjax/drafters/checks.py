"""Whether a drafter can serve a target: the pair's checks, before anything compiles.

`check_drafter` is what the decoders (and `specjax.check_model` with a drafter) run on
the pair: the drafter's type and γ, that its contract methods take the decoder's
calls, that every model it runs follows the model contract's static members
(`check_model_members`), the vocabularies, the target layers it reads, its own
`Drafter.check`, and for a tree drafter the tree and the models' tree support. A bad
pair is refused here with a message naming it, never by a trace-time error.
"""

from __future__ import annotations

import inspect

import jax
import numpy as np

from specjax.core.validation import check_int
from specjax.drafters.base import Drafter
from specjax.models.contract import check_before_compiling
from specjax.sampling.vocab import check_drafter_vocab
from specjax.verification.tree import Tree


def check_model_members(name: str, model) -> int:
    """The model contract's static members, checked; returns V."""
    missing = [m for m in ("vocab_size", "init_cache") if not hasattr(model, m)]
    if missing or not callable(model):
        lacks = f" (it has no {' or '.join(missing)})" if missing else " (it is not callable)"
        raise TypeError(
            f"{name} must follow the model contract (callable as model(tokens_BT, "
            f"positions_BT, cache), with vocab_size and init_cache), e.g. a specjax.Model; "
            f"got {type(model).__name__}{lacks}. A module of your own gets the three "
            "members as docs/models.md, 'Bring your own model', shows; "
            "specjax.check_model(model) checks every rule"
        )
    return check_int(f"{name}.vocab_size", model.vocab_size, lo=1)


def check_drafter(target, drafter: Drafter):
    """Raises ValueError/TypeError if ``drafter`` cannot serve ``target``."""
    if not isinstance(drafter, Drafter):
        hint = ""
        if callable(drafter) and hasattr(drafter, "vocab_size"):
            # A draft *model* where a drafter belongs: the commonest slip.
            hint = (
                "; to draft with a smaller model, wrap it: "
                "specjax.DraftModel(draft_model, num_draft=4)"
            )
        raise TypeError(f"drafter must be a specjax Drafter, got {type(drafter).__name__}{hint}")
    gamma = drafter.num_draft
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)):
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    if gamma < 1 and not drafter.null_drafter:
        raise ValueError(f"drafter.num_draft (γ) must be an integer >= 1, got {gamma!r}")
    _check_contract_signatures(drafter)
    for role, model in drafter.own_models().items():
        check_model_members(role, model)
    check_drafter_vocab(target, drafter)
    if drafter.target_layers:
        _check_features(target, drafter)
    drafter.check()  # the drafter's own settings, e.g. γ, mode, layers, tree
    if getattr(drafter, "tree", None) is not None:
        _check_tree(target, drafter)
    # Last: the pair's own rules above name the more specific problem first.
    for role, model in drafter.own_models().items():
        check_before_compiling(model, role)


# The arguments the decoder passes to each method of the drafter contract.
_CONTRACT_CALLS = {
    "init": ("prompts_BS", "seq_lengths_B", "cache_len", "features"),
    "propose": ("keys_BG", "state", "seq_BS", "seq_lengths_B", "sampling"),
    "update": ("state", "seq_lengths_B", "features"),
}


def _check_contract_signatures(drafter: Drafter) -> None:
    """A drafter method that cannot take the decoder's arguments is named here, with
    the call it must accept, instead of failing inside the traced loop."""
    for method, args in _CONTRACT_CALLS.items():
        fn = getattr(drafter, method)
        try:
            inspect.signature(fn).bind(*args)
        except TypeError:
            raise TypeError(
                f"{type(drafter).__name__}.{method}{inspect.signature(fn)} cannot take the "
                f"decoder's call {method}({', '.join(args)}); define it with these "
                f"positional parameters (see specjax.drafters.Drafter.{method})"
            ) from None
        except ValueError:  # no signature to read (a builtin): left to the call itself
            continue


def _check_tree(target, drafter: Drafter) -> None:
    """A tree drafter needs models that take ``tree=`` and a tree that fits them."""
    tree, name = drafter.tree, type(drafter).__name__
    if not isinstance(tree, Tree):
        raise TypeError(
            f"drafter.tree must be a specjax.verification.tree.Tree, got {type(tree).__name__}"
        )
    if drafter.num_draft != tree.depth:
        raise ValueError(
            f"drafter.num_draft (γ) must be the tree's depth {tree.depth}, got "
            f"{drafter.num_draft}: use drafter.with_tree(tree) to set both"
        )
    for role, model in {"target": target, **drafter.own_models()}.items():
        if not getattr(model, "supports_tree", False):
            raise TypeError(
                f"{role} ({type(model).__name__}) does not support tree attention (no "
                f"supports_tree = True and tree= argument), and the {name} proposes a "
                f"{tree!r}: see docs/models.md, 'Bring your own model', or use a chain"
            )
        if role == "target":
            cache = jax.eval_shape(lambda m=model: m.init_cache(1, 8))
            if not callable(getattr(cache, "compact_path", None)):
                raise TypeError(
                    f"the target's cache ({type(cache).__name__}) has no "
                    "compact_path(start_B, path_BD), which moves the accepted path's "
                    f"entries after a tree step, and the {name} proposes a {tree!r}: see "
                    "specjax.KVCache.compact_path, or use a chain"
                )
        windows = [w for w in getattr(getattr(model, "config", None), "layer_windows", ()) if w]
        # Tree keys are masked by slot, which is >= their position; that is exact as long
        # as the whole tree fits in the window (depth < window).
        if windows and min(windows) <= tree.depth:
            raise ValueError(
                f"{role} has a sliding window of {min(windows)} tokens, not deeper than the "
                f"depth {tree.depth} of the {tree!r}: use a shallower tree"
            )


def _check_features(target, drafter: Drafter) -> None:
    """A drafter that reads target layers needs a target that can return them."""
    layers = drafter.target_layers
    name = type(drafter).__name__
    try:
        params = inspect.signature(target.__call__).parameters
    except (TypeError, ValueError):
        params = {}
    takes = "feature_layers" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    if not takes:
        raise TypeError(
            f"target ({type(target).__name__}) cannot return hidden-state features: its "
            f"__call__ takes no feature_layers= argument, and the {name} reads target "
            f"layers {layers} (see docs/models.md, 'Bring your own model')"
        )
    num_layers = getattr(target, "num_layers", None)
    if num_layers is None:
        num_layers = getattr(getattr(target, "config", None), "num_layers", None)
    if not isinstance(layers, tuple) or not all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers
    ):
        raise TypeError(f"drafter.target_layers must be a tuple of ints, got {layers!r}")
    if num_layers is not None and not all(0 <= i < num_layers for i in layers):
        raise ValueError(
            f"drafter.target_layers {layers} must be layer indices in [0, {num_layers}) of "
            f"the {num_layers}-layer target"
        )
    own = getattr(drafter, "target", None)
    width = lambda m: getattr(getattr(m, "config", None), "hidden_size", None)  # noqa: E731
    if own is not None and width(own) is not None and width(own) != width(target):
        raise ValueError(
            f"the {name} was built for a target of width {width(own)}, but target has "
            f"hidden_size {width(target)}: its features would not fit the drafter"
        )
