"""The persistent compilation cache: used across processes, and never able to break a run.

Each case runs ``tests/cache_worker.py`` (one small speculative decode) in fresh
processes against a cache folder of its own, and reads what jax asked the
cache for (``requests``) and found there (``hits``).
"""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from specjax.core import compilation_cache

WORKER = Path(__file__).with_name("cache_worker.py")
READ_ERROR = "Error reading persistent compilation cache entry"


def run_worker(cache_root, *args, compilation_cache_env=None):
    env = dict(os.environ, SPECJAX_CACHE=str(cache_root))
    env.pop("SPECJAX_COMPILATION_CACHE", None)  # the suite's own shared cache
    if compilation_cache_env is not None:
        env["SPECJAX_COMPILATION_CACHE"] = compilation_cache_env
    proc = subprocess.run(
        [sys.executable, str(WORKER), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def entries(cache_root):
    return sorted((Path(cache_root) / "jax").glob("*-cache"))


# Slow tier: two fresh processes each import jax and compile (about 21 s); the fast
# tier keeps the cache's unit contracts.
@pytest.mark.slow
def test_second_process_compiles_nothing(tmp_path):
    first = run_worker(tmp_path)
    assert first["cache_dir"] == str(tmp_path / "jax")
    assert first["requests"] > 0 and first["hits"] == 0
    assert len(entries(tmp_path)) == first["requests"]  # every program was written
    second = run_worker(tmp_path)
    assert second["hits"] == second["requests"] == first["requests"]
    assert second["tokens"] == first["tokens"]
    assert second["warnings"] == []


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flipped":  # bits flipped on disk: zlib's checksum no longer holds
        path.write_bytes(data[:8] + bytes(b ^ 0xFF for b in data[8:40]) + data[40:])
    elif how == "truncated":  # a half-written file
        path.write_bytes(data[: len(data) // 2])
    else:  # well-formed compression around an executable XLA cannot parse
        raw = zlib.decompress(data)
        path.write_bytes(zlib.compress(raw[:8] + bytes(reversed(raw[8:]))))


# Slow tier: five fresh processes, 42 s.
@pytest.mark.slow
def test_corrupted_entries_are_ignored_with_a_warning_and_replaced(tmp_path):
    reference = run_worker(tmp_path)
    files = entries(tmp_path)
    kinds = ("flipped", "truncated", "garbage")
    for i, f in enumerate(files):
        corrupt(f, kinds[i % 3])
    # The run is not broken: it compiles what it cannot read, warns, and decodes the same.
    broken = run_worker(tmp_path)
    assert broken["tokens"] == reference["tokens"]
    assert broken["hits"] == 0
    assert sum(READ_ERROR in w for w in broken["warnings"]) == len(files)
    # jax never replaces an entry, so without repair every later run would compile
    # again; the CLI's repair removes them (here: the same warnings, replayed).
    repaired = run_worker(tmp_path, "repair")
    assert repaired["tokens"] == reference["tokens"]
    notes = [w for w in repaired["warnings"] if w.startswith("specjax:")]
    assert len(notes) == 1 and "could not be read" in notes[0], repaired["warnings"]
    assert entries(tmp_path) == []
    rewritten = run_worker(tmp_path)
    assert rewritten["hits"] == 0 and len(entries(tmp_path)) == rewritten["requests"]
    again = run_worker(tmp_path)
    assert again["hits"] == again["requests"] > 0
    assert again["tokens"] == reference["tokens"] and again["warnings"] == []


# Slow tier: three fresh processes, 24 s.
@pytest.mark.slow
def test_entries_of_another_jaxlib_are_never_read(tmp_path):
    other = run_worker(tmp_path, "other-jaxlib")
    assert other["requests"] > 0 and other["hits"] == 0
    written = set(entries(tmp_path))
    mine = run_worker(tmp_path)
    assert mine["hits"] == 0, "an entry keyed by another jaxlib version was read"
    assert mine["tokens"] == other["tokens"] and mine["warnings"] == []
    assert written < set(entries(tmp_path))  # both versions' entries live side by side
    assert run_worker(tmp_path)["hits"] == mine["requests"]


@pytest.mark.parametrize("value", ["off", "False"])
# Slow tier: a fresh process per case, 9 s each. One run suffices: a run that writes
# no folder leaves a later run nothing to find.
@pytest.mark.slow
def test_environment_turns_it_off(tmp_path, value):
    out = run_worker(tmp_path, compilation_cache_env=value)
    assert out["cache_dir"] == "None" and out["hits"] == 0
    assert not (tmp_path / "jax").exists()


# Slow tier: a fresh process, 9 s.
@pytest.mark.slow
def test_environment_names_the_folder(tmp_path):
    out = run_worker(tmp_path / "unused", compilation_cache_env=str(tmp_path / "mine"))
    assert out["cache_dir"] == str(tmp_path / "mine")
    assert len(list((tmp_path / "mine").glob("*-cache"))) == out["requests"] > 0


_CONFIG_PROBE = """
import json, jax
before = {k: repr(v) for k, v in jax.config.values.items()}
import specjax, specjax.cli
after = {k: repr(v) for k, v in jax.config.values.items()}
print(json.dumps({k: [before.get(k), after.get(k)] for k in before.keys() | after.keys()
                  if before.get(k) != after.get(k)}))
"""


@pytest.mark.parametrize("variable", [None, "folder"], ids=["unset", "set"])
def test_import_leaves_jax_configuration_as_it_was(tmp_path, variable):
    """`import specjax` (and its CLI module) changes no jax setting, whatever
    SPECJAX_COMPILATION_CACHE says: only the command, or the user, turns the cache on."""
    env = {k: v for k, v in os.environ.items() if k != "SPECJAX_COMPILATION_CACHE"}
    if variable:
        env["SPECJAX_COMPILATION_CACHE"] = str(tmp_path / "cache")
    env["SPECJAX_CACHE"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _CONFIG_PROBE], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {}
    assert not (tmp_path / "jax").exists() and not (tmp_path / "cache").exists()


def test_enable_disable_in_process(tmp_path):
    before = compilation_cache.enabled_dir()
    try:
        assert compilation_cache.enable(tmp_path / "c") == tmp_path / "c"
        assert compilation_cache.enabled_dir() == tmp_path / "c"
        compilation_cache.disable()
        assert compilation_cache.enabled_dir() is None
    finally:
        compilation_cache.enable(before) if before else compilation_cache.disable()


def test_remove_unreadable_entries_keeps_readable_ones(tmp_path):
    good = tmp_path / "jit_f-abc-cache"
    good.write_bytes(zlib.compress(b"\0" * 8 + b"executable"))
    bad = tmp_path / "jit_g-def-cache"
    bad.write_bytes(b"not compressed at all")
    other = tmp_path / "notes.txt"
    other.write_bytes(b"not an entry")
    assert compilation_cache.remove_unreadable_entries(tmp_path) == [bad]
    assert good.exists() and other.exists() and not bad.exists()


@pytest.mark.parametrize("argv", [["generate", ""], ["train", "missing.txt", "--out", "x"]])
def test_cli_flag_turns_the_cache_off_before_the_command_runs(monkeypatch, argv, capsys):
    from specjax import cli

    calls = []
    monkeypatch.setattr(compilation_cache, "disable", lambda: calls.append("disable"))
    assert cli.main([*argv, "--no-compilation-cache"]) == 2  # a user error, reported
    assert calls == ["disable"]
    assert cli.main(argv) == 2 and calls == ["disable"]  # without the flag: untouched
    assert "specjax: error:" in capsys.readouterr().err


def test_the_command_turns_the_cache_on_before_it_runs(monkeypatch, capsys):
    from specjax import cli

    calls = []
    monkeypatch.setattr(compilation_cache, "enable_from_environment", lambda: calls.append(1))
    assert cli.main(["generate", ""]) == 2  # a user error, reported after the cache is set
    assert calls == [1]
    assert cli.main(["generate", "", "--no-compilation-cache"]) == 2 and calls == [1]
    assert "specjax: error:" in capsys.readouterr().err
