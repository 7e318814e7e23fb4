"""index.html: self-contained, escaped, every image present; and loaded in a real headless Chromium."""
from __future__ import annotations

import io
import re
from html.parser import HTMLParser

import pytest
from browser import ensure_chromium, inspect_page
from matplotlib.image import imread

from icrl_interp.report import batch, html


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def tags(page: str) -> list[tuple[str, dict]]:
    parser = _Tags()
    parser.feed(page)
    return parser.tags


def test_page_is_self_contained_and_escaped(built):
    page = (built.out_dir / "index.html").read_text()
    found = tags(page)
    assert not any(t == "script" for t, _ in found), "the page needs no JavaScript"
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "no network references"
    imgs = [a["src"] for t, a in found if t == "img"]
    drawn = [f for info in built.figures for f in info.files]
    assert imgs == drawn and len(imgs) == 10
    assert all((built.out_dir / src).is_file() for src in imgs)
    links = [a["href"] for t, a in found if t == "a" and not a["href"].startswith("#")]
    assert links == ["summary.json", "summary.csv"] and all((built.out_dir / x).is_file() for x in links)
    # user-controlled text is escaped: the title, and input names / errors
    assert "<title>Test &lt;report&gt;</title>" in page
    assert "missing &amp; gone" in page and "missing & gone" not in page
    # one table row per input (+ one reason row per failed input), sections per family
    assert page.count('<tr class="ok"') == len([r for r in built.results if r.status == "ok"]) == 9
    assert page.count('<tr class="failed"') == 2 * 2
    assert 'id="family-sarsa"' in page and 'id="family-softmax-td"' in page
    assert "does not exist" in page


def test_embedded_page_inlines_every_image(built):
    page = html.render(built.results, built.figures, built.out_dir, embed=True)
    imgs = [a["src"] for t, a in tags(page) if t == "img"]
    assert len(imgs) == 10 and all(src.startswith("data:image/png;base64,") for src in imgs)


def test_rerun_reuses_cache_and_reproduces_summary(built):
    first = (built.out_dir / "summary.json").read_bytes()
    again = batch.run_batch(batch.collect_inputs([r.input.path for r in built.results]), built.out_dir,
                            analyzer="report_fake:analyze", progress=False)
    assert sum(r.cached for r in again) == 9
    assert batch.summary_json(again).encode() == first  # exact: copies of the cached numbers


@pytest.fixture(scope="module")
def chromium():
    binary, why = ensure_chromium()
    if binary is None:
        pytest.skip(f"headless browser test skipped: {why}")
    return binary


def _check_in_browser(path, chromium, n_images):
    seen = inspect_page(path, chromium)
    assert seen.errors == [], seen.errors
    assert len(seen.images) == n_images
    broken = [i["src"] for i in seen.images if not (i["complete"] and i["naturalWidth"] > 0)]
    assert broken == [], f"images that did not load: {broken}"
    assert "Family: sarsa" in seen.text and "All inputs" in seen.text
    shot = imread(io.BytesIO(seen.screenshot), format="png")
    assert shot.shape[0] > 100 and shot[..., :3].var() > 1e-4, "screenshot is blank"
    return seen


def test_report_in_headless_chromium(built, chromium):
    seen = _check_in_browser(built.out_dir / "index.html", chromium, 10)
    assert seen.title == "Test <report>"


def test_embedded_report_in_headless_chromium(built, chromium, tmp_path):
    single = tmp_path / "single.html"  # elsewhere: nothing beside it to load
    single.write_text(html.render(built.results, built.figures, built.out_dir, embed=True))
    _check_in_browser(single, chromium, 10)


def test_browser_check_catches_a_broken_image(built, chromium, tmp_path):
    page = (built.out_dir / "index.html").read_text()
    moved = tmp_path / "index.html"  # figures/ is not beside the copy, so every image breaks
    moved.write_text(page)
    seen = inspect_page(moved, chromium)
    assert all(i["naturalWidth"] == 0 for i in seen.images) and len(seen.errors) == 10
