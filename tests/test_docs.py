"""The docs site builds in strict mode, its links resolve, and its Python examples run.

Every ```` ```python ```` block of ``docs/**/*.md`` and ``README.md`` runs, in order, in
one namespace per page (in the slow tier; the site's build and its links are checked
in the fast one): a page is a tutorial, so its later blocks may use what its earlier
ones defined. A block whose first line starts with ``# not run`` (it needs a download,
devices or minutes that a reader must supply) is only compiled. Bash blocks are not run.

Links are checked twice: in the sources, where every relative link of a page (and of
BENCHMARKS.md and CHANGELOG.md, which pages include) must name a file of the
repository, as on GitHub and in a clone; and in the built site, where every link and
asset of every HTML file, anchors included, must exist (``mkdocs build --strict``
checks the pages' Markdown links; this also covers what the theme, the API reference
and docs/_hooks/repository_links.py write).

The pages keep their examples cheap: tiny models or the bundled pair, a few tokens, and
the same shapes wherever they can, so that one compiled program serves several pages.
"""

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))
# Included whole by docs/benchmarks.md and docs/changelog.md: their links are the site's.
INCLUDED = [ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md"]
NOT_RUN = "# not run"
# A pymdownx.snippets line that includes a file of the root: --8<-- "BENCHMARKS.md".
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)


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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """``mkdocs build --strict`` into a temporary folder: ``(the process, the folder)``."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    return done, out


def test_site_builds_in_strict_mode(site):
    """``mkdocs build --strict``: broken nav entries, links to missing pages or files,
    anchors, API references and docstrings that mkdocstrings cannot parse are errors."""
    done, out = site
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert (out / "index.html").is_file()
    assert (out / "api" / "index.html").is_file()
    # The Benchmarks page holds BENCHMARKS.md itself, and its results files are on the site.
    benchmarks = (out / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert 'id="headline-results"' in benchmarks
    assert (out / "scripts/benchmarks/results/e2e/bundled.json").is_file()


class _Links(HTMLParser):
    """The ``href``/``src`` values and the ``id``/``name`` anchors of one HTML file."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)
            elif name in ("id", "name") and value:
                self.ids.add(value)


def dead_links(site_dir: Path) -> list[str]:
    """Every link of the built site's HTML files whose file, or whose anchor in an HTML
    file, does not exist: ``"page: link"`` strings. External links are not followed; a
    link starting with ``/`` is relative to the site's root (the 404 page's)."""
    parsed = {}
    for page in site_dir.rglob("*.html"):
        parsed[page.resolve()] = parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
    dead = []
    for page, parser in parsed.items():
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                continue
            if parts.path:
                base = site_dir if parts.path.startswith("/") else page.parent
                target = (base / unquote(parts.path).lstrip("/")).resolve()
                if target.is_dir():
                    target = target / "index.html"
            else:
                target = page
            where = f"{page.relative_to(site_dir.resolve()).as_posix()}: {link}"
            if not target.is_file():
                dead.append(where)
            elif parts.fragment and target in parsed:
                if unquote(parts.fragment) not in parsed[target].ids:
                    dead.append(f"{where} (no such anchor)")
    return dead


def test_built_site_has_no_dead_links(site):
    """No link or asset of the built site is a 404, and no anchor is missing."""
    done, out = site
    assert done.returncode == 0, "the site did not build (test_site_builds_in_strict_mode)"
    dead = dead_links(out)
    assert not dead, dead


def test_dead_links_are_found(tmp_path):
    """Negative control: the check finds a missing file, a missing anchor, and a missing
    file behind a root-relative link, and passes the links that exist."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text('<h2 id="x">x</h2><a href="#x">self</a>')
    (tmp_path / "index.html").write_text(
        '<a href="a/">ok</a><a href="a/#x">ok</a><a href="https://example.com/">out</a>'
        '<a href="b/">no page</a><a href="a/#y">no anchor</a><img src="/img.png">'
    )
    assert sorted(dead_links(tmp_path)) == [
        "index.html: /img.png",
        "index.html: a/#y (no such anchor)",
        "index.html: b/",
    ]


# [text](target): relative targets only (no scheme); "#anchor" is a heading of the page.
_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs give a heading of ASCII words, code and punctuation."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown file's headings, those of the files it includes too."""
    text = _INCLUDE.sub(lambda m: (ROOT / m.group(1)).read_text(), page.read_text())
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # no headings in code
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES + INCLUDED, ids=_name)
def test_relative_links_resolve(page):
    """Every relative link names a file of the repository, and an anchor of a Markdown file
    names one of its headings: links work on GitHub and in a clone alike. (On the site,
    the strict build and `test_built_site_has_no_dead_links` check them.)"""
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
