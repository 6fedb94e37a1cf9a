#!/usr/bin/env python
"""Does the bundled target write code that parses? Greedy completions of held-out headers.

The headers are ``--num`` top-level ``def`` lines of the standard-library files held
out from training (:func:`specjax.training.data.is_heldout`) whose exact line appears in no
training document, neither the standard library's training split nor the installed
packages' files (so the model never saw the header): each held-out file's first such
line in sorted file order, then each file's second, and so on. Each header alone is
the prompt, as in ``specjax generate "def f(x):"``.

Protocol: greedy decoding of up to ``--max-new-tokens`` tokens. The function ends
at the first non-blank line that is not indented (or at EOS); when the budget ends
first, the last, possibly cut, line is dropped. The completion *parses* when
``ast.parse(header + completion)`` succeeds and the body holds at least one
statement. Plain greedy and speculative greedy give the same tokens (tested), so
plain decoding is used.

    python scripts/training/eval_completions.py                         # the bundled target
    python scripts/training/eval_completions.py \\
        --json scripts/benchmarks/results/eval_completions/bundled.json  # its committed result
    python scripts/training/eval_completions.py --model runs/pair/target --json out.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys

import jax

import specjax
from specjax.io.pretrained import default_pair_path
from specjax.training import data

HEADER = re.compile(r"^def [A-Za-z_]\w*\(.*\)( -> .+)?:[ \t]*$")


def heldout_headers(num: int) -> list[str]:
    """The first ``num`` unseen top-level ``def`` lines of the held-out files."""
    heldout = data.stdlib_documents("heldout")
    training = data.stdlib_documents("train") + data.site_packages_documents(exclude=heldout)
    seen = set()
    for doc in training:
        seen.update(line.rstrip() for line in doc.splitlines() if line.startswith("def "))
    per_file = []
    for doc in heldout:
        found = []
        for line in doc.splitlines():
            line = line.rstrip()
            if HEADER.match(line) and line not in seen and line not in found:
                found.append(line)
        per_file.append(found)
    # Round robin over the files (each file's first unseen header, then each file's
    # second, ...), so the headers come from as many files as possible.
    headers = []
    for rank in range(max(map(len, per_file), default=0)):
        for found in per_file:
            if rank < len(found) and found[rank] not in headers and len(headers) < num:
                headers.append(found[rank])
    return headers


def function_body(completion: str, budget_hit: bool) -> str:
    """The completion up to the end of the function (see the module docstring)."""
    lines = completion.split("\n")
    body = []
    for i, line in enumerate(lines):
        if i > 0 and line.strip() and not line[0].isspace():
            return "\n".join(body)  # dedented: the function has ended
        body.append(line)
    if budget_hit and len(body) > 1:
        body = body[:-1]
    return "\n".join(body)


def parses(header: str, body: str) -> tuple[bool, str]:
    try:
        tree = ast.parse(header + body)
    except SyntaxError as e:
        return False, f"SyntaxError: {e.msg} (line {e.lineno})"
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef) or not fn.body:
        return False, "no function body"
    return True, "ok"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default=str(default_pair_path() / "target"))
    parser.add_argument("--num", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json", help="write the completions and verdicts here")
    args = parser.parse_args(argv)

    target = specjax.load_pretrained(args.model)
    tok = target.tokenizer
    eos = tok.token_to_id("<|endoftext|>")
    headers = heldout_headers(args.num)
    prompts = [tok.encode(h, add_special_tokens=False).ids for h in headers]
    out = specjax.generate(
        jax.random.key(0),
        target,
        prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=specjax.SamplingConfig.greedy(),
        eos_id=eos,
    )
    rows = []
    for header, ids, n in zip(headers, out.to_lists(), out.lengths.tolist(), strict=True):
        hit_eos = bool(ids) and ids[-1] == eos
        text = tok.decode(ids[:-1] if hit_eos else ids)
        body = function_body(text, budget_hit=not hit_eos and n >= args.max_new_tokens)
        ok, why = parses(header, body)
        rows.append({"header": header, "completion": body, "parses": ok, "why": why})
        print(f"{'PARSES' if ok else 'FAILS '} {header}   [{why}]")
        print("    " + body.replace("\n", "\n    ")[:600], flush=True)
    passed = sum(r["parses"] for r in rows)
    print(f"{passed} of {len(rows)} completions parse")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "passed": passed, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
