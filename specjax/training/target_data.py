"""Training data a target writes for its drafters, and prompts to evaluate them on.

A drafter learns to predict what its target will write, so besides the corpus
(`specjax.training.data`) its training stream holds the target's own continuations of corpus
windows (`generate_continuations`) and, for an instruction-tuned target, its chat
answers to instruction-style prompts built from the corpus (`generate_answers`); rows
alternate greedy and temperature 1 (per-row settings in one batch). `mix_streams`
mixes them with the corpus; `train_logged` trains a drafter on the stream as the
scripts do; `heldout_prompts` gives the evaluation prompts and `evaluate_drafter` what
a drafter achieves on them.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import generate, speculative_generate
from specjax.io.chat import apply_chat_template
from specjax.sampling import SamplingConfig
from specjax.training import data as data_lib


def generate_continuations(
    target, corpus, n_tokens, *, seed, batch=32, prompt_len=32, new=96, minutes=None, log=None
):
    """Target continuations of random corpus windows; rows alternate T=0 and T=1.

    Returns:
        ``int32[N]``: prompt + continuation sequences, back to back, until ``n_tokens``
        tokens were generated or ``minutes`` passed; ``log`` (e.g. ``print``) gets a
        progress line after each batch.
    """
    rng = np.random.default_rng(seed)

    def prompts():
        starts = rng.integers(0, len(corpus) - prompt_len, batch)
        return np.stack([corpus[s : s + prompt_len] for s in starts])

    return _sequences(
        target,
        prompts,
        n_tokens,
        key_offset=seed,
        new=new,
        minutes=minutes,
        label="generated",
        log=log,
    )


def _sequences(
    target, prompts, n_tokens, *, key_offset, new, minutes, label, eos_id=None, log=None
):
    """``int32[N]``: prompt + target output sequences, batch after batch of ``prompts()``.

    Rows alternate T=0 and T=1 (per-row temperatures in one batch); it stops after
    ``n_tokens`` generated tokens or ``minutes``.
    """
    out, made, t0, call = [np.zeros((0,), np.int32)], 0, time.time(), 0
    while made < n_tokens and not _out_of_time(t0, minutes):
        rows = prompts()
        temps = jnp.asarray([0.0, 1.0] * (len(rows) // 2), jnp.float32)
        res = generate(
            jax.random.key(key_offset + call),
            target,
            [list(map(int, r)) for r in rows],
            max_new_tokens=new,
            sampling=SamplingConfig(temperature=temps),
            eos_id=eos_id,
        )
        for p_row, row in zip(rows, res.to_lists(), strict=True):
            out.append(np.concatenate([np.asarray(p_row, np.int32), np.asarray(row, np.int32)]))
            made += len(row)
        call += 1
        if log is not None:
            log(f"{label}: {made:,}/{n_tokens:,} tokens ({made / (time.time() - t0):,.0f} tok/s)")
    return np.concatenate(out).astype(np.int32)


def _out_of_time(t0: float, minutes: float | None) -> bool:
    return minutes is not None and time.time() - t0 > 60 * minutes


# Instruction-style prompts for an instruct target, built from the corpus so that there
# are as many distinct ones as the budget needs. Answers are the target's own.
CODE_TASKS = (
    "Explain what this Python function does, step by step.",
    "Rewrite this function so that it is easier to read. Keep its behaviour.",
    "Add type hints and a Google-style docstring to this function.",
    "Write pytest unit tests for this function.",
    "Rename the variables of this function to descriptive names and show the result.",
    "Is there a bug or an edge case this function does not handle? Explain and fix it.",
    "Summarise this code in two sentences.",
    "Convert the loops in this function to comprehensions where it makes sense.",
)
WRITE_TASKS = (
    "Write a Python function that {}.",
    "How would you {} in Python? Show the code.",
    "Write a short program that {}, with comments.",
)
ACTIONS = (
    "reverses a string",
    "checks whether a number is prime",
    "merges two sorted lists",
    "counts the words in a text file",
    "parses a CSV file into dictionaries",
    "computes the nth Fibonacci number",
    "removes duplicates from a list keeping order",
    "flattens a nested list",
    "finds the longest common prefix of strings",
    "validates an email address",
    "converts Celsius to Fahrenheit",
    "reads a JSON file and prints its keys",
    "sorts a dictionary by value",
    "computes a factorial recursively",
    "checks whether a string is a palindrome",
    "downloads nothing but builds a URL with query parameters",
    "implements binary search",
    "groups words by their first letter",
    "computes the mean and median of numbers",
    "generates all permutations of a list",
    "implements a stack class",
    "renames all files in a folder to lower case",
    "finds the most common element",
    "splits a list into chunks of size n",
    "transposes a matrix",
)
CONCEPTS = (
    "recursion",
    "a hash table",
    "Big-O notation",
    "a Python decorator",
    "a generator",
    "a context manager",
    "list comprehensions",
    "the difference between a list and a tuple",
    "object-oriented programming",
    "unit testing",
    "a linked list",
    "version control",
    "photosynthesis",
    "gravity",
    "the water cycle",
    "inflation in economics",
    "a neural network",
    "the internet",
    "climate change",
    "how vaccines work",
    "the French Revolution",
    "a healthy breakfast",
    "time management",
    "how to write a good essay",
    "prime numbers",
)
CONCEPT_TASKS = (
    "Explain {} in simple terms.",
    "What is {}? Give an example.",
    "Write a short paragraph about {} for a beginner.",
    "Give three facts about {}.",
)


def code_snippets(documents: list[str], *, max_lines: int = 24) -> list[str]:
    """Top-level functions of the corpus documents that fit in ``max_lines`` lines."""
    snippets = []
    for doc in documents:
        lines = doc.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("def ")]
        for i in starts:
            j = i + 1
            while j < len(lines) and (not lines[j] or lines[j][0] in " \t#"):
                j += 1
            if 3 <= j - i <= max_lines:
                snippets.append("\n".join(lines[i:j]).rstrip())
    return snippets


def instruction_prompts(snippets: list[str], n: int, rng: np.random.Generator) -> list[str]:
    """``n`` user messages: half about corpus functions, half writing/explaining tasks."""
    out = []
    for i in range(n):
        kind = i % 4
        if kind < 2 and snippets:
            task = CODE_TASKS[rng.integers(len(CODE_TASKS))]
            out.append(f"{task}\n\n```python\n{snippets[rng.integers(len(snippets))]}\n```")
        elif kind == 2:
            out.append(
                WRITE_TASKS[rng.integers(len(WRITE_TASKS))].format(
                    ACTIONS[rng.integers(len(ACTIONS))]
                )
            )
        else:
            out.append(
                CONCEPT_TASKS[rng.integers(len(CONCEPT_TASKS))].format(
                    CONCEPTS[rng.integers(len(CONCEPTS))]
                )
            )
    return out


def chat_ids(target, message: str) -> np.ndarray:
    """``int32[P]``: one user message rendered with the target's chat template."""
    messages = [{"role": "user", "content": message}]
    return np.asarray(apply_chat_template(target, messages, tokenize=True), np.int32)


def generate_answers(
    target,
    snippets,
    n_tokens,
    *,
    seed,
    batch=32,
    new=160,
    max_prompt=320,
    minutes=None,
    log=None,
):
    """The target's chat answers to `instruction_prompts`, rows alternating T=0 and T=1.

    Each sequence is the rendered prompt followed by the answer up to and including
    its end-of-turn token, so the drafter sees the template as decoding will.
    """
    from specjax.io.chat import end_of_turn_ids

    rng = np.random.default_rng(seed + 1)

    def prompts():
        rows = []
        while len(rows) < batch:
            ids = chat_ids(target, instruction_prompts(snippets, 1, rng)[0])
            if len(ids) <= max_prompt:
                rows.append(ids)
        return rows

    return _sequences(
        target,
        prompts,
        n_tokens,
        key_offset=seed + 10_000,
        new=new,
        minutes=minutes,
        label="chat answers",
        eos_id=list(end_of_turn_ids(target)),
        log=log,
    )


def heldout_prompts(target, heldout, *, chat, corpus_kw, n_prompts=16, prompt_len=32):
    """Evaluation prompts: held-out corpus windows, or chat prompts about held-out code."""
    if chat:
        snippets = code_snippets(data_lib.stdlib_documents("heldout", **corpus_kw))
        rng = np.random.default_rng(12345)
        return [chat_ids(target, m).tolist() for m in instruction_prompts(snippets, n_prompts, rng)]
    starts = np.linspace(0, len(heldout) - prompt_len - 1, n_prompts).astype(int)
    return np.stack([heldout[s : s + prompt_len] for s in starts])


def mix_streams(corpus, generated, fraction: float):
    """``(stream, repeats)``: the corpus, then ``generated`` repeated to ``fraction`` of it.

    ``generated`` is repeated (at least once, unless ``fraction <= 0``) so that it makes
    up about ``fraction`` of the stream.
    """
    reps = (
        0
        if fraction <= 0
        else max(1, round(fraction * len(corpus) / ((1 - fraction) * len(generated))))
    )
    return np.concatenate([corpus] + [generated] * reps), reps


def train_logged(drafter, stream, config, *, work, resume: bool, log):
    """``(result, minutes)``: `~specjax.training.train_drafter` with checkpoints in
    ``work / "train"``, logging the steps, throughput and final loss.

    The block drafter's and the EAGLE head's scripts train through this one function.
    """
    from specjax.training.drafter import train_drafter

    t0 = time.time()
    result = train_drafter(drafter, stream, config, checkpoint_dir=work / "train", resume=resume)
    minutes = (time.time() - t0) / 60
    log(
        f"trained {result.steps} steps in {minutes:.1f} min, {result.tokens_per_second:,.0f} "
        f"tok/s, final loss {result.losses[-1]:.4f}"
    )
    return result, minutes


def evaluate_drafter(
    target, drafter, prompts, *, gammas, temperatures=(0.0, 1.0), new=64, name=None, log=None
) -> dict:
    """Tokens per target call (τ) and acceptance of ``drafter`` on ``prompts``.

    One row per temperature and γ (``drafter.with_draft(γ)``), keyed
    ``"T{temperature}_gamma{γ}"`` (after ``name`` and ``_`` when given); ``log`` gets
    each row as it is measured.
    """
    report = {}
    for temperature in temperatures:
        sampling = SamplingConfig(temperature=temperature)
        for gamma in gammas:
            res = speculative_generate(
                jax.random.key(0),
                target,
                drafter.with_draft(gamma),
                prompts,
                max_new_tokens=new,
                sampling=sampling,
            )
            row = dict(
                tokens_per_call=round(float(res.tokens_per_call), 3),
                acceptance=round(float(res.stats.acceptance_rate), 3),
            )
            key = f"T{temperature:g}_gamma{gamma}"
            report[f"{name}_{key}" if name else key] = row
            if log is not None:
                log(f"eval {name + ' ' if name else ''}T={temperature:g} γ={gamma}: {row}")
    return report
