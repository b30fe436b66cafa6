"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated pages join the site at build time, and a link from a page
to a file of the repository outside docs/ (a result, a config) is checked and shown as that file's path: the site
holds docs/ alone, so such a link would lead nowhere there. A link that leaves the repository is an error (a
warning, which ``mkdocs build --strict`` fails on)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # the checkout's graft, wherever mkdocs runs from

from graft.docs_gen import PAGES  # noqa: E402

log = get_plugin_logger("graft")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#:]+)(#[^)\s]*)?\)")
"""A relative markdown link: text, target, optional anchor (targets with a scheme have a ``:``)."""


def on_files(files, config):
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files


def on_page_markdown(markdown, page, config, files):
    docs = Path(config.docs_dir).resolve()
    here = (docs / page.file.src_uri).parent

    def outside(m: re.Match) -> str:
        text, target = m.group(1), m.group(2)
        path = Path(os.path.normpath(here / target))
        if path.is_relative_to(docs):
            return m.group(0)
        if not path.is_relative_to(ROOT):
            log.warning(f"{page.file.src_uri}: the link {target!r} leaves the repository")
            return text
        shown = str(path.relative_to(ROOT))
        if not path.exists():
            log.warning(f"{page.file.src_uri}: the link {target!r} names {shown}, which does not exist")
        return f"`{shown}`" if text.strip("`").rstrip("/") == shown else f"{text} (`{shown}`)"

    return LINK.sub(outside, markdown)
