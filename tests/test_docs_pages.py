"""The built documentation as a person sees it: every page opened in headless Chromium at
1280 px, failing on a page wider than the window, a table whose columns run past its column (the
last ones hidden behind a scroll bar), a word broken mid-word, or a placeholder default
(`Sentinel.UNSET`) in the CLI reference.

The site is `$DLLM_DOCS_SITE` when set (a finished `mkdocs build`), else built here (minutes):
`NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir /tmp/site && DLLM_DOCS_SITE=/tmp/site
python -m pytest -m slow tests/test_docs_pages.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import Browser, chromium

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(chromium() is None, reason="no chromium (apt-get install chromium)")]
ROOT = Path(__file__).resolve().parent.parent

LAYOUT_PROBLEMS = r"""
(() => {
  const problems = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) problems.push(`page ${doc.scrollWidth - doc.clientWidth}px wider than the window`);
  for (const table of document.querySelectorAll("article table")) {
    const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;     // Material's scroller
    const past = table.getBoundingClientRect().right - box.getBoundingClientRect().right;
    if (past > 1 || box.scrollWidth > box.clientWidth + 1)
      problems.push(`table "${table.rows[0].textContent.trim().slice(0, 50)}" runs ${Math.round(Math.max(past, box.scrollWidth - box.clientWidth))}px past its column`);
    for (const cell of table.querySelectorAll("td, th")) {
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const m of node.data.matchAll(/[^\s\-\/_.,=:]+/g)) {
          if (m[0].length < 2) continue;
          const range = document.createRange();
          range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
          const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
          if (tops.size > 1) { problems.push(`"${m[0]}" broken mid-word in a table`); break; }
        }
      }
    }
  }
  if (/Sentinel\.|\bUNSET\b/.test(document.body.innerText)) problems.push("a placeholder default (Sentinel.UNSET) is shown");
  return problems;
})()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    given = os.environ.get("DLLM_DOCS_SITE")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                   check=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return out


def test_every_page_fits_1280_px_and_shows_no_placeholder(site, tmp_path):
    pages = sorted(p for p in site.rglob("index.html") if "assets" not in p.parts)
    assert len(pages) > 10
    shots = Path(os.environ.get("DLLM_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    found = {}
    with Browser(width=1280, height=900) as browser:
        for page in pages:
            browser.open(page.as_uri())
            problems = browser.evaluate(LAYOUT_PROBLEMS)
            name = str(page.parent.relative_to(site)) or "home"
            if problems:
                found[name] = problems[:5]
                browser.screenshot(shots / f"docs-{name.replace('/', '-')}.png")
    assert not found, found
