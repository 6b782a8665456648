"""The documentation site builds with ``mkdocs build --strict``, and its navigation is the
README's documentation list (same pages, same order)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _readme_pages() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    # absolute links (to the repository's main branch), so that they work on a package index too
    return re.findall(r"\]\((?:https://github\.com/[\w.-]+/[\w.-]+/blob/main/)?docs/([^)#]+\.md)\)", section)


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_navigation_is_the_readmes_documentation_list():
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs (the docs extra)")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = _nav_pages(config["nav"])
    assert pages[0] == "index.md"
    assert pages[1:] == _readme_pages()
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert set(pages) == on_disk, "every page in docs/ is in the navigation, and only those"


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is the docs extra (pip install -e '.[docs]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "plugins" / "index.html").is_file()
