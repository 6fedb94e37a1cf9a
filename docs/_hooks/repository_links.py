"""mkdocs hooks: links from the site's pages to files of the repository outside docs/.

The pages are written so that their links work on GitHub and in a clone: a page of
``docs/`` links to ``../BENCHMARKS.md#trees-chain-against-tree`` or
``../colab/quickstart.ipynb``, and ``BENCHMARKS.md``, which ``docs/benchmarks.md``
includes whole (``--8<-- "BENCHMARKS.md"``, pymdownx.snippets), links to its results
files as ``scripts/benchmarks/results/...``. On the site each of those would be a 404.
Two hooks make them resolve, so that ``mkdocs build --strict`` (with
``validation.links.not_found: warn``) can fail on every link that does not:

* `on_files` publishes each file outside ``docs/`` that a page, or a file a page
  includes, links to, at its repository path (``scripts/benchmarks/results/e2e/
  bundled.json`` is ``/scripts/benchmarks/results/e2e/bundled.json`` on the site;
  Markdown files become pages outside the nav). A Markdown file that a page includes is
  not published again: links to it go to the page that includes it.
* `on_page_markdown` rewrites a page's relative links to such files into links to their
  place on the site.

Links inside an included file are relative to the repository root, and stay as they
are: they resolve because an included file sits at the root of the repository and the
page that includes it at the root of ``docs/`` (both checked here). A link to a folder
or to a missing file is left alone, and the strict build fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from urllib.parse import unquote

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

# A pymdownx.snippets line that includes a whole file: --8<-- "BENCHMARKS.md".
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)
# An inline link or image, [text](target) or ![alt](target); the target has no spaces.
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)

# Repository file -> its path on the site (relative to the site root), for this build.
_SITE_PATHS: dict[Path, str] = {}


def _outside_code(text: str) -> str:
    """``text`` with its fenced code blocks blanked out (links there are code)."""
    return _FENCE.sub("", text)


def _relative_targets(text: str):
    """The relative link targets of ``text``, outside code: ``(path, anchor)`` pairs."""
    for _, target, _ in _LINK.findall(_outside_code(text)):
        if _SCHEME.match(target) or target.startswith(("#", "/")):
            continue
        path, _, anchor = target.partition("#")
        yield path, anchor


def on_files(files, config):
    """Publishes the repository files outside ``docs/`` that the pages link to."""
    root = Path(config.config_file_path).resolve().parent
    docs = Path(config.docs_dir).resolve()
    _SITE_PATHS.clear()

    pages = [f for f in files if f.is_documentation_page() and f.abs_src_path]
    sources: list[tuple[Path, str]] = []  # (the folder its links are relative to, text)
    for page in pages:
        source = Path(page.abs_src_path).resolve()
        text = source.read_text(encoding="utf-8")
        sources.append((source.parent, text))
        for name in _INCLUDE.findall(text):
            included = (root / name).resolve()
            if "/" in page.src_uri or included.parent != root:
                raise PluginError(
                    f"{page.src_uri} includes {name}: an included file must be at the "
                    "root of the repository and the page that includes it at the root of "
                    "docs/, so that the file's links resolve on the site as on GitHub "
                    "(docs/_hooks/repository_links.py)"
                )
            _SITE_PATHS[included] = page.src_uri
            sources.append((root, included.read_text(encoding="utf-8")))

    for base, text in sources:
        for path, _ in _relative_targets(text):
            target = (base / unquote(path)).resolve()
            if target in _SITE_PATHS or not target.is_file():
                continue
            if target.is_relative_to(docs) or not target.is_relative_to(root):
                continue
            site_path = target.relative_to(root).as_posix()
            if files.get_file_from_path(site_path) is not None:
                raise PluginError(
                    f"{site_path}, linked from a page, would replace the page or file of "
                    "the same path in docs/ (docs/_hooks/repository_links.py)"
                )
            files.append(
                File.generated(
                    config,
                    site_path,
                    abs_src_path=str(target),
                    inclusion=InclusionLevel.NOT_IN_NAV,
                )
            )
            _SITE_PATHS[target] = site_path
    return files


def on_page_markdown(markdown, page, config, files):
    """Points the page's links to repository files at their place on the site."""
    if not page.file.abs_src_path:
        return markdown
    source_dir = Path(page.file.abs_src_path).resolve().parent
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if _SCHEME.match(target) or target.startswith(("#", "/")):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        site_path = _SITE_PATHS.get((source_dir / unquote(path)).resolve())
        if site_path is None:
            return match.group(0)
        new = posixpath.relpath(site_path, here or ".") + hash_ + anchor
        return match.group(1) + new + match.group(3)

    # Rewrite outside fenced code only: split on the fences and keep them as they are.
    pieces, last = [], 0
    for fence in _FENCE.finditer(markdown):
        pieces.append(_LINK.sub(rewrite, markdown[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(_LINK.sub(rewrite, markdown[last:]))
    return "".join(pieces)
