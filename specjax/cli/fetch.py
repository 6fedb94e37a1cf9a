"""``specjax fetch``: models by name, into the cache, once."""

from __future__ import annotations

from specjax.cli.common import UserError


def cmd_fetch(args) -> int:
    """Fetches each named model (or lists the names with ``--list``); prints each path."""
    from specjax.io import fetch

    if args.list or not args.names:
        for name in fetch.names():
            model = fetch.remote(name)
            where = model.path()
            state = f"cached: {where}" if where.is_file() else f"~{model.size_mb} MB, not cached"
            print(f"{name:20s} {model.about} ({state})")
        return 0
    unknown = [n for n in args.names if n not in fetch.names()]
    if unknown:
        raise UserError(f"no model called {', '.join(unknown)}; known: {', '.join(fetch.names())}")
    for name in args.names:
        try:
            print(fetch.fetch(name))
        except fetch.FetchError as e:
            raise UserError(f"fetch {name}: {e}") from None
    return 0
