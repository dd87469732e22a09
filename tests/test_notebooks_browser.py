"""The quickstart in a real JupyterLab and Chromium: the views render, grow and respond to clicks."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from browser.lab import chromium, jupyterlab, missing

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).parent / "_artifacts"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("lab") / "notebooks"
    root.mkdir()
    shutil.copy(REPO / "notebooks" / "01_quickstart.ipynb", root)
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyterlab(root) as url, chromium(root.parent / "chromium-profile") as page:
        page.goto(url.format(path="01_quickstart.ipynb"))
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        yield page


def _shot(page_or_locator, name: str) -> None:
    page_or_locator.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _run_all_cells(page) -> None:
    """Run > Run All Cells, again until the first cell starts (the kernel may still be connecting)."""
    started = page.locator(".jp-InputArea-prompt", has_text=re.compile(r"\[(\*|\d+)\]")).first
    for _ in range(12):
        page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        try:
            started.wait_for(state="attached", timeout=5_000)
            return
        except Exception:
            page.keyboard.press("Escape")
    raise AssertionError("JupyterLab never started running the notebook")


def test_quickstart_runs_and_its_views_work(page):
    _run_all_cells(page)

    table = page.locator(".kf-card-table").first
    table.locator("tbody tr").first.wait_for(state="attached", timeout=120_000)
    assert table.locator("tbody tr").count() >= 10, "one row per captured card"

    progress = page.locator(".kf-run-progress").first
    progress.wait_for(state="attached", timeout=60_000)
    tree = page.locator(".kf-search-tree").first
    tree.locator(".kf-node[data-id]").first.wait_for(state="attached", timeout=120_000)
    progress.scroll_into_view_if_needed()
    _shot(page, "quickstart-running")

    page.locator(".kf-run-progress .kf-pill", has_text="finished").first.wait_for(state="attached", timeout=150_000)
    page.get_by_text("outputs match eager").wait_for(state="attached", timeout=120_000)
    assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").filter(
        has_text="Traceback").count() == 0
    assert progress.locator("button[data-action='pause']").is_disabled(), "a finished run cannot be paused"

    table.scroll_into_view_if_needed()
    nodes = tree.locator(".kf-node[data-id]")
    ids = sorted(int(n) for n in nodes.evaluate_all("els => els.map(e => e.dataset.id)"))
    assert len(ids) >= 2

    # sorting by a header click
    table.locator("th", has_text="tried").click()
    tried = [t.strip() for t in table.locator("tbody tr td:nth-child(8)").all_inner_texts()]
    counts = [0 if t == "–" else int(t) for t in tried]
    assert counts == sorted(counts, reverse=True) and counts[0] >= 2

    # a revision: its source, highlighted, and its diff against the parent
    tree.locator(f".kf-node[data-id='{ids[-1]}'] > circle").last.click()
    source = page.locator(".kf-source-view").first
    source.locator(".kf-title", has_text=f"Candidate #{ids[-1]}").wait_for(timeout=30_000)
    assert source.locator(".kf-code .kf-src").count() > 20 and source.locator(".kf-tok-kw").count() > 0
    assert "parent #" in source.locator(".kf-header").inner_text()
    assert source.locator(".kf-intent").inner_text().strip()
    assert source.locator(".kf-verdict .kf-pill").count() == 1
    tree.scroll_into_view_if_needed()
    _shot(page, "dashboard-source")
    source.locator("[data-tab='diff']").click()
    diff = source.locator(".kf-diff")
    diff.wait_for(timeout=10_000)
    assert diff.locator("tr.kf-add").count() + diff.locator("tr.kf-del").count() > 0
    _shot(page, "dashboard-diff")

    # zoom and pan change the tree's viewBox
    svg = tree.locator("svg")
    before = svg.get_attribute("viewBox")
    svg.hover()
    page.mouse.wheel(0, -400)
    page.wait_for_function("([el, v]) => el.getAttribute('viewBox') !== v", arg=[svg.element_handle(), before])
    assert page.locator(".kf-error:visible").count() == 0, "no error banner in any view"
    chart = page.locator(".jp-OutputArea-output", has=page.locator(".vega-embed svg, .vega-embed canvas")).first
    chart.scroll_into_view_if_needed()
    _shot(chart, "chart-speedup")
