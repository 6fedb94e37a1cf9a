"""The docs site builds in strict mode, its links resolve, and its Python examples run.

Every ```` ```python ```` block of ``docs/**/*.md`` and ``README.md`` runs, in order, in
one namespace per page (in the slow tier; the site's build and its links are checked
in the fast one): a page is a tutorial, so its later blocks may use what its earlier
ones defined. A block whose first line starts with ``# not run`` (it needs a download,
devices or minutes that a reader must supply) is only compiled. Bash blocks are not run.

The pages keep their examples cheap: tiny models or the bundled pair, a few tokens, and
the same shapes wherever they can, so that one compiled program serves several pages.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))
NOT_RUN = "# not run"


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks(text: str) -> list[str]:
    """The ```` ```python ```` blocks of a page, in order (a block ends at a line that is
    exactly ```` ``` ````)."""
    blocks, current = [], None
    for line in text.splitlines(keepends=True):
        if current is None:
            if line.rstrip() == "```python":
                current = []
        elif line.rstrip() == "```":
            blocks.append("".join(current))
            current = None
        else:
            current.append(line)
    assert current is None, "a ```python block is never closed"
    return blocks


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p.read_text())]


def test_every_page_is_in_the_nav():
    """A page missing from mkdocs.yml's nav would build, but no reader would find it."""
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [_name(p) for p in PAGES[1:] if f": {p.relative_to(DOCS).as_posix()}\n" not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_site_builds_in_strict_mode(tmp_path):
    """``mkdocs build --strict``: broken nav entries, anchors, API references and docstrings
    that mkdocstrings cannot parse are errors."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "api" / "index.html").is_file()


# [text](target): relative targets only (no scheme); "#anchor" is a heading of the page.
_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs give a heading of ASCII words, code and punctuation."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page):
    """Every relative link names a file of the repository, and an anchor of a Markdown file
    names one of its headings: links work on GitHub and in a clone alike. (mkdocs checks
    links between its own pages; links out of docs/ are left to this test.)"""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in _LINK.findall(text):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


# Slow tier: the pages share the bundled pair's compiled Sampler programs, so whichever
# page runs first compiles them (about 15 s, over the fast tier's budget for one test),
# and all of them together cost about a minute.
@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_name)
def test_python_blocks_run(page):
    """The page's Python blocks run in order in one namespace; ``# not run`` blocks compile."""
    namespace = {"__name__": f"docs_{page.stem}"}
    for index, code in enumerate(python_blocks(page.read_text())):
        compiled = compile(code, f"{_name(page)}[python block {index}]", "exec")
        if code.startswith(NOT_RUN):
            continue
        exec(compiled, namespace)
