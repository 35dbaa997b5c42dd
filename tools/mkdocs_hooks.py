"""MkDocs hooks (mkdocs.yml: hooks): fill each `<!-- gendocs: NAME -->` marker of a page with the
reference generated from the code (tools/gendocs.py), so the built site cannot drift from it. A
marker naming no generator fails the build."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # mkdocs runs from anywhere

from tools import gendocs

MARKER = re.compile(r"^<!-- gendocs: ([a-z]+) -->$", re.M)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in gendocs.GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generator {name!r} ({match.group(0)})")
        return gendocs.render(name)

    return MARKER.sub(fill, markdown)
