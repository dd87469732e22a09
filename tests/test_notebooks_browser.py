"""The tutorials and the views in a real JupyterLab and Chromium: live, obeying, still there tomorrow.

Every test fails on a console error and on any request that leaves 127.0.0.1 (Chromium resolves
no outside host). Waits are on conditions, never fixed sleeps. Screenshots (light and dark theme,
1440 and 1024 px) go to tests/browser/screenshots/ for a person to look at.
"""
from __future__ import annotations

import itertools
import json
import re
import shutil
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest

from browser.lab import REQUIRED, chromium, jupyterlab, missing, required

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SHOTS = Path(__file__).parent / "browser" / "screenshots"
LIGHT, DARK = "JupyterLab Light", "JupyterLab Dark"

# A search that never runs out on its own (the built-in proposer's first kernel, made unique each
# time), so the test, not the budget, decides when it ends.
ENDLESS = '''import dataclasses
import kforge
from kforge.proposers import Proposal, make_proposer

class Endless:
    name, fast = "endless", True
    def __init__(self):
        self.inner, self.base, self.n = make_proposer("builtin"), {}, 0
    def propose(self, request):
        key = request.card.key
        if key not in self.base:
            self.base[key] = self.inner.propose(dataclasses.replace(request, parent=None, lineage=(), siblings=(), tried=()))
        self.n += 1
        return Proposal(self.base[key].source + f"\\n/* variant {self.n} */\\n", f"variant {self.n}", "endless")'''

CONTROLS = [
    ENDLESS + '''

model, inputs = kforge.example("tiny_transformer")
session = kforge.Session(model, inputs, device="cpu")
cards = session.capture(timing_budget_ms=2)''',
    '''run = session.optimize(proposer=Endless(), ops=["softmax", "layer_norm", "gelu"], iterations=200,
                       policy="linear", background=True)
dash = session.dashboard()
dash''',
    '''run.wait()
evaluated = run.progress.evaluated   # candidates judged: the count the view's header starts with
print(f"RUN {run.state.value} {evaluated}")''',
]

MAGICS = [
    "%load_ext kforge",
    "%kforge optimize --help",
    "%kforge capture tiny_cnn --device cpu",
    "%kforge optimize --iterations 2 --ops relu --background",
    "session.run.wait()\n%kforge dashboard",
    # a blocking search, from Python and from the cell magic: the same live view while the cell waits
    ENDLESS + '''

session.optimize(proposer=Endless(), ops=["relu"], iterations=400, policy="linear")''',
    # NB: every planned card, each new to the search: long enough (tens of seconds) to be seen live
    "%%kforge optimize\niterations 3\npolicy linear",
]
# Run one by one after the rest: each ends in an error (which stops "run all").
MAGIC_MISTAKES = {
    "%kforge optimize --proposer openai": r"^%kforge optimize: --proposer openai: .*OPENAI_API_KEY",
    "%kforge optimize --ops sofmax": r"^%kforge optimize: --ops: kforge has no operator 'sofmax'; did you mean 'softmax'\?",
}


def _notebook(path: Path, cells: list[str]) -> None:
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                     "source": src} for i, src in enumerate(cells)],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                       "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


class Watch:
    """Console errors, uncaught exceptions and requests to anything but 127.0.0.1, as they happen."""

    def __init__(self, page):
        self.problems: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console error: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        page.on("request", self._request)

    def _request(self, request) -> None:
        url = urlparse(request.url)
        if url.scheme in ("data", "blob", "about", "chrome-extension"):
            return
        if url.hostname != "127.0.0.1":
            self.problems.append(f"request leaves 127.0.0.1: {request.url}")

    def check(self, expected: str | None = None) -> None:
        """No problem seen since the last check; ``expected``: a pattern of problems the test caused."""
        problems, self.problems[:] = list(self.problems), []
        if expected is not None:
            problems = [p for p in problems if not re.search(expected, p)]
        assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    why = missing()
    if why and required():
        pytest.fail(f"{REQUIRED} is set and the browser test cannot run: {why}")
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("lab")
    root = base / "notebooks"
    root.mkdir()
    for name in ("01_quickstart.ipynb", "02_llm_proposer.ipynb"):
        shutil.copy(REPO / "notebooks" / name, root)
    _notebook(root / "controls.ipynb", CONTROLS)
    _notebook(root / "magics.ipynb", MAGICS + list(MAGIC_MISTAKES))
    SHOTS.mkdir(parents=True, exist_ok=True)
    with jupyterlab(root) as url, chromium(base / "chromium-profile") as page:
        watch = Watch(page)
        yield SimpleNamespace(page=page, url=url, root=root, base=base, watch=watch)
        watch.check()


_WORKSPACES = itertools.count()


def _fresh_workspace(url: str, name: str) -> str:
    """``url`` (``/lab/tree/{path}``) in a workspace of its own, for ``name`` (not ``?reset``, whose
    own navigation opened the notebook a second time)."""
    return url.replace("/lab/tree/", f"/lab/workspaces/kf-{next(_WORKSPACES)}/tree/").format(path=name)


def _start_kernel(lab, name: str) -> str:
    """A session and kernel for notebook ``name``, made through the server's REST API before the page
    opens it; returns the kernel's id. JupyterLab joins it instead of starting kernels of its own.

    NB: under load, JupyterLab opening a notebook started two kernels and shut one down, once seconds
    after the test had run cells on it: only the cells run after the switch ran, and the test waited
    for a search never started."""
    parts = urlparse(lab.url)
    token = re.search(r"token=(\w+)", parts.query).group(1)
    body = json.dumps({"path": name, "name": name, "type": "notebook", "kernel": {"name": "python3"}}).encode()
    req = urllib.request.Request(f"{parts.scheme}://{parts.netloc}/api/sessions", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=60) as answer:
        return json.loads(answer.read())["kernel"]["id"]


def _open(lab, name: str):
    """Open ``name`` alone (a fresh workspace, its own kernel made first) and wait until the page is
    connected to that kernel and it is idle; returns the notebook panel."""
    page = lab.page
    kernel = _start_kernel(lab, name)
    page.goto(_fresh_workspace(lab.url, name))
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    panel.locator(".jp-Cell").first.wait_for(timeout=60_000)
    try:
        page.wait_for_function(
            """id => { const w = window.jupyterapp.shell.currentWidget;
                       const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                       return !!k && k.id === id && k.status === 'idle' && k.connectionStatus === 'connected'; }""",
            arg=kernel, timeout=90_000)
    except Exception:
        raise AssertionError(f"the page never joined kernel {kernel} of {name}; the notebook:\n"
                             + _notebook_state(lab)) from None
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(state="attached", timeout=60_000)
    return panel


def _close_dialog(page) -> None:
    """A JupyterLab dialog in the way (on a loaded machine, a kernel-connection notice once hid the
    Run menu for 30 s): print what it said, so a failure shows it, and close it."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.first.is_visible():
        text = " | ".join(dialog.first.inner_text().split("\n"))
        print("JupyterLab dialog:", text)
        assert "died" not in text, f"the kernel died: {text}"
        page.keyboard.press("Escape")
        if dialog.count() and dialog.first.is_visible():
            dialog.first.locator(".jp-Dialog-button.jp-mod-accept, .jp-Dialog-button").last.click()


def _run_all_cells(page, above: int | None = None) -> None:
    """Every cell (``above``: every cell above that one), through JupyterLab's own command
    (notebook:run-all-cells / run-all-above), again until the first cell starts (the kernel may still be
    connecting).

    NB: not through the Run menu: on a loaded machine a click on the menu while it laid out once
    ran the last cell alone (the first two never ran, and the test waited for a search never started).
    """
    first = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first.locator(".jp-CodeCell").first
    started = first.locator(".jp-InputArea-prompt", has_text=re.compile(r"\[(\*|\d+)\]"))
    for _ in range(12):
        _close_dialog(page)
        # NB: not awaited: the command's promise settles when the last cell has run
        page.evaluate("""above => { const nb = window.jupyterapp.shell.currentWidget.content;
                                     if (above !== null) nb.activeCellIndex = above;
                                     window.jupyterapp.commands.execute(above === null ? 'notebook:run-all-cells'
                                                                                       : 'notebook:run-all-above'); }""",
                      above)
        try:
            started.wait_for(state="attached", timeout=5_000)
            return
        except Exception:  # NB: a dialog came up, or the kernel was still connecting: close, try again
            page.keyboard.press("Escape")
    raise AssertionError("JupyterLab never started running the notebook")


def _run_cell(page, index: int) -> None:
    """Run cell ``index`` alone (JupyterLab's notebook:run-cell on it)."""
    page.evaluate("""i => { const nb = window.jupyterapp.shell.currentWidget.content;
                           nb.activeCellIndex = i; window.jupyterapp.commands.execute('notebook:run-cell'); }""", index)


def _kernel_says(page, code: str) -> str:
    """What ``code`` prints when the notebook's kernel runs it (not in a cell). It queues behind every
    message the page sent the kernel before, as a cell run then would."""
    return page.evaluate("""async code => {
      const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      let out = "";
      const future = kernel.requestExecute({ code, store_history: false });
      future.onIOPub = (msg) => {
        if (msg.header.msg_type === "stream") out += msg.content.text;
        if (msg.header.msg_type === "error") out += `${msg.content.ename}: ${msg.content.evalue}`;
      };
      await future.done;
      return out;
    }""", code)


def _wait_idle_after_run(lab, timeout: float = 300_000, cells: int | None = None) -> None:
    """Every code cell has run: each prompt shows its execution count (none is [*] or [ ]) and the
    kernel is idle. NB: not "no prompt shows [*]": between one cell's end and the next one's
    start there can be a moment with none, and a test once read its outputs there."""
    page = lab.page
    try:
        page.wait_for_function(
            "n => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]"
            ".slice(0, n === null ? undefined : n).every(p => /\\[\\d+\\]/.test(p.textContent))", arg=cells, timeout=timeout)
    except Exception:
        raise AssertionError(f"not every cell ran within {timeout / 1000:.0f} s; the notebook:\n"
                             + _notebook_state(lab)) from None
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(state="attached", timeout=60_000)


def _theme(page, theme: str) -> None:
    page.evaluate("t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme)
    light = "true" if theme == LIGHT else "false"
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)


def _shots(page, target, name: str) -> None:
    """Screenshots of ``target`` in both themes at 1440 and 1024 px."""
    for theme in (LIGHT, DARK):
        _theme(page, theme)
        for width in (1440, 1024):
            page.set_viewport_size({"width": width, "height": 1400})
            page.wait_for_function(f"() => window.innerWidth === {width}")
            # NB: a viewport taller than the output, so that the picture is the whole output, not a scrolled part
            tall = min(4000, int(target.bounding_box()["height"]) + 400)
            if tall > 1400:
                page.set_viewport_size({"width": width, "height": tall})
                page.wait_for_function(f"() => window.innerHeight === {tall}")
            target.scroll_into_view_if_needed()
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            target.screenshot(path=str(SHOTS / f"{name}-{'dark' if theme == DARK else 'light'}-{width}.png"))
    _theme(page, LIGHT)
    page.set_viewport_size({"width": 1440, "height": 1500})


def _wait_output(page, cell: int, text: str, timeout: float = 60_000) -> None:
    """Until an output of cell ``cell`` (in the notebook's model) holds ``text`` in its HTML: a display
    update has landed (JupyterLab then renders that output anew)."""
    page.wait_for_function(
        """([i, text]) => {
             const outputs = window.jupyterapp.shell.currentWidget.content.model.cells.get(i).outputs;
             for (let k = 0; k < outputs.length; k++) {
               const html = outputs.get(k).data["text/html"];
               if (html && String(html).includes(text)) return true;
             }
             return false;
           }""", arg=[cell, text], timeout=timeout)


def _png_height(data: str) -> int:
    """The height of a base64 PNG, from its header."""
    import base64

    return int.from_bytes(base64.b64decode(data[:64])[20:24], "big")


def _notebook_state(lab) -> str:
    """What the open notebook and its server say: each cell's prompt and outputs (errors with their
    traceback's end), any dialog, and the end of JupyterLab's log. A wait that times out says why."""
    try:
        cells = lab.page.evaluate("""() => {
          const cells = window.jupyterapp.shell.currentWidget.content.widgets;
          return cells.map((w, i) => {
            const m = w.model, outs = [];
            const prompt = w.node.querySelector('.jp-InputArea-prompt');
            if (m.outputs) for (let k = 0; k < m.outputs.length; k++) {
              const o = m.outputs.get(k).toJSON();
              if (o.output_type === 'error') outs.push(o.ename + ': ' + o.evalue + ' | ' + (o.traceback || []).slice(-3).join(' | '));
              else if (o.output_type === 'stream') outs.push(String(o.text).slice(-1500));
              else outs.push(Object.keys(o.data || {}).join(','));
            }
            return `cell ${i} ${prompt ? prompt.textContent : ''}: ${outs.join(' || ')}`;
          });
        }""")
    except Exception as exc:  # NB: the page itself may be what broke
        cells = [f"(the notebook could not be read: {exc})"]
    dialog = lab.page.locator(".jp-Dialog")
    said = dialog.first.inner_text() if dialog.count() else "none"
    logs = sorted(lab.base.glob("jupyterlab-*.log"))
    tail = logs[-1].read_text(errors="replace")[-3000:] if logs else "(no log)"
    return "\n".join(cells) + f"\ndialog: {said}\nJupyterLab log, its end:\n{tail}"


def _wait_explained(lab, locator, timeout: float, **kw) -> None:
    """``locator.wait_for`` that, when it times out, fails with the notebook's state."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.wait_for(timeout=timeout, **kw)
    except PlaywrightTimeout:
        raise AssertionError(f"timed out after {timeout / 1000:.0f} s waiting for {locator}; the notebook:\n"
                             + _notebook_state(lab)) from None


def _layout_holds_at_1024(page, cell) -> None:
    """A 1024 px window with the file browser open: card labels are not cut short, the source pane is
    as wide as the dashboard (under the tree), its tabs hold on one line, and its code starts in sight."""
    if page.evaluate("() => window.jupyterapp.shell.leftCollapsed"):
        page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
    page.wait_for_function("() => !window.jupyterapp.shell.leftCollapsed")
    page.set_viewport_size({"width": 1024, "height": 800})
    page.wait_for_function("() => window.innerWidth === 1024")
    table, source = cell.locator(".kf-card-table").first, cell.locator(".kf-source-view").first
    page.wait_for_function("el => el.classList.contains('kf-narrow')", arg=table.element_handle())
    cut = table.locator("tbody td.kf-card-col").evaluate_all(
        "els => els.filter(e => e.scrollWidth > e.clientWidth + 1 && e.clientWidth < 300)"
        ".map(e => `${e.textContent} (${e.clientWidth} px)`)")
    assert not cut, f"card labels cut short at 1024 px: {cut}"
    dashboard = cell.locator(".kf-card-table").first.bounding_box()
    pane = source.bounding_box()
    assert pane["width"] >= 0.9 * dashboard["width"], f"the source pane is {pane['width']:.0f} px of {dashboard['width']:.0f}"
    tops = source.locator(".kf-tab").evaluate_all("els => els.map(e => Math.round(e.getBoundingClientRect().top))")
    assert tops and len(set(tops)) == 1, f"the source tabs wrap at 1024 px: {tops}"
    source.evaluate("e => e.scrollIntoView({block: 'start'})")
    code = source.locator(".kf-pane").first.bounding_box()
    assert code and code["y"] < 800 - 40, "the source's code starts below the fold"
    _shots_at(page, cell, "quickstart-dashboard-1024-files-open")
    page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
    page.wait_for_function("() => window.jupyterapp.shell.leftCollapsed")


def _shots_at(page, target, name: str) -> None:
    """One screenshot of ``target`` at the viewport's width and theme (the whole output, however tall)."""
    size = page.viewport_size
    tall = min(4000, int(target.bounding_box()["height"]) + 400)
    if tall > size["height"]:
        page.set_viewport_size({"width": size["width"], "height": tall})
        page.wait_for_function(f"() => window.innerHeight === {tall}")
    target.scroll_into_view_if_needed()
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    target.screenshot(path=str(SHOTS / f"{name}.png"))
    page.set_viewport_size(size)


def _count(progress) -> int:
    text = progress.locator(".kf-header .kf-muted").first.inner_text()
    return int(re.match(r"(\d+) evaluated", text).group(1))


def test_controls_and_selection_work_while_a_cell_is_running(lab):
    page = lab.page
    panel = _open(lab, "controls.ipynb")
    _run_all_cells(page)
    progress = panel.locator(".kf-run-progress").first
    tree = panel.locator(".kf-search-tree").first
    table = panel.locator(".kf-card-table").first
    source = panel.locator(".kf-source-view").first
    _wait_explained(lab, tree.locator(".kf-node[data-id]").first, 180_000, state="attached")
    waiting = panel.locator(".jp-CodeCell").nth(2).locator(".jp-InputArea-prompt")
    page.wait_for_function("el => el.textContent.includes('*')", arg=waiting.element_handle(), timeout=60_000)

    # Pause: the run itself reports "paused" (the pill shows the run's state, not the click)
    progress.locator("button[data-action='pause']").click()
    progress.locator(".kf-pill[data-status='paused']").wait_for(timeout=60_000)
    assert "*" in waiting.inner_text(), "the cell running run.wait() is still busy"
    paused_at = _count(progress)

    # a control channel this browser cannot reach (as with a kernel on another machine): the button
    # says at once that the busy kernel cannot pass the click on, and what to do (no 4 s timeout)
    channel = re.compile(r"http://127\.0\.0\.1:\d+/[0-9a-f]{32}/\w+$")
    page.route(channel, lambda route: route.abort())
    progress.locator("button[data-action='resume']").click()
    banner = progress.locator(".kf-error-text")
    banner.filter(has_text=re.compile(".")).wait_for(timeout=10_000)
    said = banner.inner_text()
    assert "not reachable from this browser" in said and "the kernel is running a cell" in said, said
    assert "interrupt the running cell" in said and "within" not in said, said
    assert progress.locator(".kf-pill[data-status='paused']").count() == 1, "the run did not move"
    progress.locator(".kf-error button.kf-link").click()
    page.unroute(channel)
    lab.watch.check(expected=r"Failed to load resource|net::ERR_FAILED")

    # selection while the kernel is busy: a row shows its tree (pinned), Follow search goes back
    first_key = table.locator("tbody tr.kf-selected").get_attribute("data-key")
    searching = table.locator("tbody tr[data-key]").filter(
        has=page.locator(".kf-pill[data-status='searching']")).get_attribute("data-key")
    assert first_key == searching, "the table follows the search"
    shown, row = table.locator(".kf-table-wrap").bounding_box(), table.locator("tbody tr.kf-selected").bounding_box()
    assert shown["y"] <= row["y"] and row["y"] + row["height"] <= shown["y"] + shown["height"] + 1, \
        "the row followed is in sight in the table's box"
    rows = table.locator("tbody tr[data-key]")
    target = next(k for k in rows.evaluate_all("els => els.map(e => e.dataset.key)") if k != first_key)
    table.locator(f"tbody tr[data-key='{target}']").click()
    table.locator(f"tbody tr.kf-selected[data-key='{target}']").wait_for(timeout=10_000)
    table.locator(".kf-badge[data-follow='off']").wait_for(timeout=10_000)
    tree.locator(".kf-empty:visible").wait_for(timeout=10_000)   # that card has no candidates
    table.locator("button[data-action='follow']").click()
    table.locator(".kf-badge[data-follow='on']").wait_for(timeout=10_000)
    table.locator(f"tbody tr.kf-selected[data-key='{searching}']").wait_for(timeout=10_000)
    node = tree.locator(".kf-node[data-id]").first
    node.wait_for(timeout=10_000)
    node_id = node.get_attribute("data-id")
    node.locator("circle").last.click()
    source.locator(".kf-title", has_text=f"Candidate #{node_id}").wait_for(timeout=10_000)
    source.locator(".kf-code .kf-src").first.wait_for(timeout=10_000)
    tree.locator(f".kf-node-selected[data-id='{node_id}']").wait_for(timeout=10_000)

    # Resume: the run goes on (more evaluations than when paused); the pinned node stays selected
    progress.locator("button[data-action='resume']").click()
    progress.locator(".kf-pill[data-status='searching']").wait_for(timeout=60_000)
    count = progress.locator(".kf-header .kf-muted").first.element_handle()
    page.wait_for_function("([el, n]) => parseInt(el.textContent) > n", arg=[count, paused_at], timeout=120_000)
    assert tree.locator(".kf-node-selected").get_attribute("data-id") == node_id, "a pinned node stays"
    # Follow newest: the tree and the source move to each new candidate as it comes
    tree.locator("button[data-action='follow']").click()
    tree.locator(".kf-badge[data-follow='on']").wait_for(timeout=10_000)
    newest = "el => Math.max(...[...el.querySelectorAll('.kf-node[data-id]')].map(n => +n.dataset.id))"
    followed = max(int(node_id), tree.evaluate(newest))
    page.wait_for_function(
        f"([el, n]) => {{ const top = ({newest})(el); const sel = el.querySelector('.kf-node-selected');"
        " return top > n && sel && +sel.dataset.id === top; }", arg=[tree.element_handle(), followed], timeout=120_000)
    shown = tree.locator(".kf-node-selected").get_attribute("data-id")
    source.locator(".kf-title", has_text=re.compile(r"Candidate #(\d+)")).wait_for(timeout=10_000)
    page.wait_for_function("([el, id]) => +el.querySelector('.kf-title').textContent.replace(/\\D/g, '') >= id",
                           arg=[source.element_handle(), int(shown)], timeout=30_000)
    _shots(page, panel.locator(".jp-Cell").nth(1), "dashboard-live")

    # a burst of clicks while the cell is still busy (rows, a node, rows, a node): they reach the kernel
    # only when the cell ends, and are applied once, in order; the views agree all along
    keys = rows.evaluate_all("els => els.map(e => e.dataset.key)")
    others = [k for k in keys if k != searching]
    for key in (others[0], searching, others[-1], searching):
        table.locator(f"tbody tr[data-key='{key}']").click()
        table.locator(f"tbody tr.kf-selected[data-key='{key}']").wait_for(timeout=10_000)
    picked = tree.locator(".kf-node[data-id]").nth(1)
    picked_id = picked.get_attribute("data-id")
    picked.locator("circle").last.click()
    tree.locator(f".kf-node-selected[data-id='{picked_id}']").wait_for(timeout=10_000)
    source.locator(".kf-title", has_text=f"Candidate #{picked_id}").wait_for(timeout=10_000)
    table.locator(f"tbody tr[data-key='{others[0]}']").click()
    table.locator(f"tbody tr[data-key='{searching}']").click()
    table.locator(f"tbody tr.kf-selected[data-key='{searching}']").wait_for(timeout=10_000)
    picked.locator("circle").last.click()
    tree.locator(f".kf-node-selected[data-id='{picked_id}']").wait_for(timeout=10_000)
    assert "*" in waiting.inner_text(), "the clicks were made while the cell was busy"

    # Stop: the run ends, run.wait() returns, and the view's count is the run's evaluations
    progress.locator("button[data-action='stop']").click()
    progress.locator(".kf-pill[data-status='stopped']").wait_for(timeout=120_000)
    out = panel.locator(".jp-CodeCell").nth(2).locator(".jp-OutputArea-output", has_text=re.compile(r"RUN \w+ \d+"))
    out.wait_for(timeout=60_000)
    state, evaluated = re.search(r"RUN (\w+) (\d+)", out.inner_text()).groups()
    assert state == "stopped" and _count(progress) == int(evaluated) > paused_at
    # the run's end sends the dashboard's output again (its static snapshot), which JupyterLab renders anew
    _wait_output(page, 1, ">stopped<")
    progress.locator(".kf-pill[data-status='stopped']").wait_for(timeout=30_000)
    assert _count(progress) == int(evaluated), "the view rendered anew shows the same count"
    progress.locator(".kf-bar[data-state='stopped']").wait_for(timeout=30_000)   # a stopped run's bar is its own
    assert panel.locator(".kf-error:visible").count() == 0

    # once the kernel is idle it has applied the burst: the card, its candidate, the source and the
    # kernel's own selection are the last click's, in every view
    _wait_idle_after_run(lab)
    said = _kernel_says(page, "print('SELECTED', dash.table.selected_key, dash.tree.card_key, dash.tree.selected_id, "
                              "dash.source.candidate_id)")
    assert said.split() == ["SELECTED", searching, searching, picked_id, picked_id], said
    table.locator(f"tbody tr.kf-selected[data-key='{searching}']").wait_for(timeout=10_000)
    tree.locator(f".kf-node-selected[data-id='{picked_id}']").wait_for(timeout=10_000)
    source.locator(".kf-title", has_text=re.compile(rf"^Candidate #{picked_id}$")).wait_for(timeout=10_000)
    assert tree.locator(f".kf-node[data-id='{picked_id}']").count() == 1, "the candidate is the card's"
    lab.watch.check()

    # a kernel restart (no reload): every view says its kernel is gone, keeps what it showed, and its
    # buttons rest
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    for view in (progress, table, tree, source):
        view.locator(".kf-gone").filter(has_text="kernel").wait_for(timeout=60_000)
    assert progress.locator("button[data-action]:enabled").count() == 0
    assert tree.locator(f".kf-node-selected[data-id='{picked_id}']").count() == 1
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(state="attached", timeout=60_000)
    lab.watch.check()


def test_quickstart_runs_and_survives_without_its_kernel(lab):
    page = lab.page
    panel = _open(lab, "01_quickstart.ipynb")
    _run_all_cells(page)
    table = panel.locator(".kf-card-table").first
    table.locator("tbody tr").first.wait_for(state="attached", timeout=120_000)
    progress = panel.locator(".kf-run-progress").first
    progress.locator(".kf-pill[data-status='finished']").wait_for(timeout=300_000)
    _wait_idle_after_run(lab)
    _wait_output(page, 6, ">finished<")   # the views rendered anew from the run's last output
    progress.locator(".kf-pill[data-status='finished']").wait_for(timeout=30_000)
    table.locator("tbody tr").nth(9).wait_for(state="attached", timeout=30_000)
    assert panel.locator(".jp-OutputArea-output", has_text="outputs match eager").count() == 1
    assert panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").filter(
        has_text="Traceback").count() == 0
    assert progress.locator("button[data-action='pause']").is_disabled(), "a finished run cannot be paused"
    assert table.locator("tbody tr").count() >= 10, "one row per captured card"

    # sorting, filtering and the keyboard
    table.locator("th[data-col='candidates']").click()
    column = table.locator("thead th").evaluate_all("els => els.findIndex(e => e.dataset.col === 'candidates')") + 1
    tried = [t.strip() for t in table.locator(f"tbody tr td:nth-child({column})").all_inner_texts()]
    counts = [0 if t == "–" else int(t) for t in tried]
    assert counts == sorted(counts, reverse=True) and counts[0] >= 2
    table.locator(".kf-filters select[title='status']").select_option("not searched")
    assert table.locator("tbody tr[data-key] .kf-pill[data-status='not searched']").count() == \
        table.locator("tbody tr[data-key]").count() > 0
    table.locator(".kf-filters select[title='status']").select_option("")
    # the op and vendor filters: the rows left are those of that op / vendor, and the vendors partition the table
    cards = table.locator("tbody tr[data-key]")
    every = cards.evaluate_all("els => els.map(e => [e.dataset.key, e.dataset.op, e.dataset.vendor])")
    ops = [o for o in table.locator("select[title='operator'] option").evaluate_all("els => els.map(e => e.value)") if o]
    op = max(ops, key=lambda o: sum(r[1] == o for r in every))
    table.locator("select[title='operator']").select_option(op)
    assert sorted(cards.evaluate_all("els => els.map(e => e.dataset.key)")) == sorted(k for k, o, _ in every if o == op)
    assert table.locator(".kf-header .kf-muted").first.inner_text().endswith(f"{sum(r[1] == op for r in every)} shown")
    table.locator("select[title='operator']").select_option("")
    vendors = table.locator("select[title='vendor library'] option").evaluate_all("els => els.map(e => e.value)")
    assert "-" in vendors and len(vendors) >= 3, "no vendor, and at least one vendor library"
    seen = []
    for vendor in vendors[1:]:
        table.locator("select[title='vendor library']").select_option(vendor)
        got = cards.evaluate_all("els => els.map(e => [e.dataset.key, e.dataset.vendor])")
        assert got and all(v == vendor for _, v in got), f"vendor {vendor}: {got}"
        seen += [k for k, _ in got]
    assert sorted(seen) == sorted(k for k, _, _ in every), "each card under exactly one vendor choice"
    table.locator("select[title='vendor library']").select_option("")
    assert cards.count() == len(every)
    table.locator(".kf-input").fill("softmax")
    assert table.locator("tbody tr[data-key]").count() >= 1
    assert all("softmax" in t for t in table.locator("tbody tr[data-key] td:first-child").all_inner_texts())
    table.locator(".kf-input").fill("")
    first = table.locator("tbody tr[data-key]").nth(0).get_attribute("data-key")
    second = table.locator("tbody tr[data-key]").nth(1).get_attribute("data-key")
    table.locator("tbody tr[data-key]").nth(0).click()
    table.locator(".kf-table-wrap").press("ArrowDown")
    table.locator(f"tbody tr.kf-selected[data-key='{second}']").wait_for(timeout=10_000)
    assert first != second
    table.locator("tbody tr[data-key]").filter(
        has=page.locator(".kf-pill[data-status='winner'], .kf-pill[data-status='eager']")).first.click()

    # a revision: its source, highlighted, and its diff against the parent
    tree = panel.locator(".kf-search-tree").first
    tree.locator(".kf-node[data-id]").nth(1).wait_for(state="attached", timeout=10_000)
    ids = sorted(int(n) for n in tree.locator(".kf-node[data-id]").evaluate_all("els => els.map(e => e.dataset.id)"))
    assert len(ids) >= 2
    tree.locator(f".kf-node[data-id='{ids[-1]}'] > circle").last.click()
    source = panel.locator(".kf-source-view").first
    source.locator(".kf-title", has_text=f"Candidate #{ids[-1]}").wait_for(timeout=30_000)
    assert source.locator(".kf-code .kf-src").count() > 20 and source.locator(".kf-tok-kw").count() > 0
    assert "parent #" in source.locator(".kf-header").inner_text()
    source.locator("[data-tab='diff']").click()
    diff = source.locator(".kf-diff")
    diff.wait_for(timeout=10_000)
    assert diff.locator("tr.kf-add").count() + diff.locator("tr.kf-del").count() > 0
    # sibling labels never overlap
    boxes = tree.locator(".kf-node[data-id] text").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })")
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], "tree labels overlap"
    # zoom changes the tree's viewBox
    svg = tree.locator("svg")
    before = svg.get_attribute("viewBox")
    svg.hover()
    page.mouse.wheel(0, -400)
    page.wait_for_function("([el, v]) => el.getAttribute('viewBox') !== v", arg=[svg.element_handle(), before])
    zoomed = svg.get_attribute("viewBox")
    tree.locator(".kf-header button", has_text="Fit").click()
    page.wait_for_function("([el, v]) => el.getAttribute('viewBox') !== v", arg=[svg.element_handle(), zoomed])
    assert panel.locator(".kf-error:visible").count() == 0, "no error banner in any view"
    _shots(page, panel.locator(".jp-Cell").nth(6), "quickstart-dashboard")
    # at 1024 px the important columns are all in view, not clipped
    page.set_viewport_size({"width": 1024, "height": 1400})
    page.wait_for_function("() => window.innerWidth === 1024")
    table.scroll_into_view_if_needed()
    wrap = table.locator(".kf-table-wrap").bounding_box()
    important = table.locator("thead th:not(.kf-optional)")
    assert important.count() >= 5
    for col in important.evaluate_all("els => els.map(e => e.dataset.col)"):
        box = table.locator(f"th[data-col='{col}']").bounding_box()
        assert box and box["x"] + box["width"] <= wrap["x"] + wrap["width"] + 1, f"column {col} is clipped at 1024 px"
    _layout_holds_at_1024(page, panel.locator(".jp-Cell").nth(6))
    page.set_viewport_size({"width": 1440, "height": 1500})
    chart = panel.locator(".jp-OutputArea-output", has=page.locator(".vega-embed svg, .vega-embed canvas")).first
    _shots(page, chart, "quickstart-chart")
    lab.watch.check()

    # save (the state of the widgets shown goes with the notebook)
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30_000)
    saved = json.loads((lab.root / "01_quickstart.ipynb").read_text())
    bundles = [o.get("data", {}) for c in saved["cells"] for o in c.get("outputs", [])]
    widgets = [b for b in bundles if "application/vnd.jupyter.widget-view+json" in b]
    assert widgets and all("text/html" in b or "image/png" in b for b in widgets), \
        "every view and chart carries a static snapshot"
    # the views shown as the run started hold its last state, not the first
    evaluated = _count(progress)
    first = [o.get("data", {}) for o in saved["cells"][6]["outputs"]]
    html = "".join(next(b["text/html"] for b in first if "application/vnd.jupyter.widget-view+json" in b))
    run_part = html[:html.index("kf-static-card-table")]
    assert ">finished<" in run_part and f"{evaluated} evaluated" in run_part, run_part
    chart = "".join(next(b["image/png"] for o in saved["cells"][8]["outputs"] for b in [o.get("data", {})]
                         if "image/png" in b))
    assert _png_height(chart) > 150, "the live chart's picture is the run's last drawing, not 'no data yet'"
    # the same server, a fresh kernel, the notebook trusted ("open it tomorrow"): every view comes back
    # from the state saved with the notebook, says that its kernel is gone, and shows how the run ended
    _stop_kernels(lab)
    page.goto(_fresh_workspace(lab.url, "01_quickstart.ipynb"))
    out = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    dashboard = out.locator(".jp-Cell").nth(6)
    lost = out.get_by_text("model not found")
    _wait_explained(lab, dashboard.locator(".kf-card-table tbody tr[data-key]").or_(lost).first, 90_000, state="attached")
    assert lost.count() == 0, f"reopened with a fresh kernel: {lost.count()} views say 'model not found'"
    for kind in ("run-progress", "card-table", "search-tree", "source-view"):
        dashboard.locator(f".kf-{kind} .kf-gone").filter(has_text="kernel").wait_for(timeout=30_000)
    assert out.get_by_text("model not found").count() == 0
    kept = saved["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    shown = {b["application/vnd.jupyter.widget-view+json"]["model_id"] for b in widgets}
    assert shown <= set(kept), "the state of every view shown is saved with the notebook"
    dashboard.locator(".kf-run-progress .kf-pill[data-status='finished']").wait_for(timeout=10_000)
    assert _count(dashboard.locator(".kf-run-progress")) == evaluated
    assert dashboard.locator(".kf-run-progress button[data-action]:enabled").count() == 0
    # the saved views still move together (in the browser: there is no kernel to ask)
    row = dashboard.locator("tbody tr[data-key]").filter(
        has=page.locator(".kf-pill[data-status='winner'], .kf-pill[data-status='eager']")).last
    key = row.get_attribute("data-key")
    row.click()
    dashboard.locator(f"tbody tr.kf-selected[data-key='{key}']").wait_for(timeout=10_000)
    node = dashboard.locator(".kf-search-tree .kf-node[data-id]").last
    node_id = node.get_attribute("data-id")
    node.locator("circle").last.click()
    dashboard.locator(".kf-source-view .kf-title", has_text=f"Candidate #{node_id}").wait_for(timeout=10_000)
    assert out.locator(".vega-embed").count() >= 2, "the live charts come back too"
    _shots_at(page, dashboard, "quickstart-reopened-fresh-kernel")
    lab.watch.check()

    # and reopened on another machine (another notebook secret: untrusted), with no kernel
    other = lab.base / "elsewhere"
    other.mkdir()
    nb = dict(saved)
    nb["metadata"] = {k: v for k, v in saved["metadata"].items() if k != "kernelspec"}
    (other / "01_quickstart.ipynb").write_text(json.dumps(nb))
    with jupyterlab(other, home=lab.base / "home-elsewhere") as url:
        try:
            page.goto(_fresh_workspace(url, "01_quickstart.ipynb"))
            dialog = page.locator(".jp-Dialog")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            try:
                dialog.wait_for(timeout=10_000)
                dialog.locator("button", has_text=re.compile("No Kernel|Cancel")).first.click()
            except Exception:
                pass
            out = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
            out.get_by_text("Operator cards").first.wait_for(timeout=30_000)
            out.get_by_text("Optimization run").first.wait_for(timeout=30_000)
            assert out.get_by_text("Search tree").count() >= 1 and out.get_by_text("model not found").count() == 0
            assert out.locator(".jp-RenderedImage img").count() >= 2, "the charts as pictures"
            dashboard = out.locator(".jp-Cell").nth(6)
            snapshot = dashboard.locator(".kf-static-run-progress")
            assert "finished" in snapshot.inner_text() and f"{evaluated} evaluated" in snapshot.inner_text(), \
                "the dashboard shown at the run's start says how it ended"
            # at 1024 px (beside the side bar) every static view fits its output: nothing runs out of it
            page.set_viewport_size({"width": 1024, "height": 1400})
            page.wait_for_function("() => window.innerWidth === 1024")
            wide = dashboard.locator(".kf-static").evaluate_all(
                "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className + ' ' + e.scrollWidth"
                " + ' > ' + e.clientWidth)")
            assert dashboard.locator(".kf-static").count() >= 3 and not wide, f"clipped at 1024 px: {wide}"
            page.set_viewport_size({"width": 1440, "height": 1500})
            _shots(page, out.locator(".jp-Cell").nth(6), "quickstart-reopened")
            lab.watch.check()
        finally:
            # NB: leave that server's page before it stops, failed or not, or its reconnect attempts
            # reach the next test as console errors
            page.set_viewport_size({"width": 1440, "height": 1500})
            page.goto("about:blank")
    lab.watch.check()


def _stop_kernels(lab) -> None:
    """Shut down every kernel of the server (its REST API), as closing the notebook for the day does."""
    parts = urlparse(lab.url)
    token = re.search(r"token=(\w+)", parts.query).group(1)
    base, auth = f"{parts.scheme}://{parts.netloc}", {"Authorization": f"token {token}"}
    lab.page.goto("about:blank")   # NB: first, or the page reconnects and starts one again
    with urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions", headers=auth), timeout=60) as answer:
        sessions = json.loads(answer.read())
    for session in sessions:
        req = urllib.request.Request(f"{base}/api/sessions/{session['id']}", method="DELETE", headers=auth)
        urllib.request.urlopen(req, timeout=60).read()


def test_notebook_02_runs_to_the_end_without_a_key(lab):
    page = lab.page
    panel = _open(lab, "02_llm_proposer.ipynb")
    _run_all_cells(page)
    _wait_idle_after_run(lab)
    said = panel.locator(".jp-OutputArea-output", has_text=re.compile("uses the built-in proposer instead|is set"))
    assert said.count() >= 1
    panel.locator(".kf-run-progress .kf-pill[data-status='finished']").wait_for(timeout=60_000)
    # NB: the tree's last push may come after the progress pill's; a search too quick for the table to
    # ever show it "searching" is still the card the dashboard follows
    panel.locator(".kf-search-tree .kf-node[data-id]").first.wait_for(timeout=30_000)
    # the row the table followed is in sight (the softmax card sat below the table's scrolled box)
    table = panel.locator(".kf-card-table").first
    shown, row = table.locator(".kf-table-wrap").bounding_box(), table.locator("tbody tr.kf-selected").bounding_box()
    assert shown["y"] <= row["y"] and row["y"] + row["height"] <= shown["y"] + shown["height"] + 1, (shown, row)
    # a plain chart (not live) renders with no network: the offline renderer the notebook enables, not a CDN script
    plain = panel.locator(".jp-CodeCell").filter(has_text="charts.time_breakdown(session)")
    plain.locator(".vega-embed svg, .vega-embed canvas").first.wait_for(timeout=60_000)
    assert panel.get_by_text("Error loading script").count() == 0
    assert panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").filter(
        has_text="Traceback").count() == 0
    lab.watch.check()


def test_magics_in_the_browser(lab):
    page = lab.page
    panel = _open(lab, "magics.ipynb")
    n = len(MAGICS)
    # the two blocking searches (optimize() and %%kforge optimize): the highest count their cells showed
    # while still running
    page.evaluate("""cells => { window.kfLive = {}; setInterval(() => {
      const all = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell');
      for (const i of cells) {
        const cell = all[i];
        const counts = cell && cell.querySelector('.kf-run-progress .kf-header .kf-muted');
        if (counts && cell.querySelector('.jp-InputArea-prompt').textContent.includes('*')) {
          window.kfLive[i] = Math.max(window.kfLive[i] || 0, parseInt(counts.textContent) || 0);
        }
      } }, 100); }""", [n - 2, n - 1])
    _run_all_cells(page, above=n)
    blocking = panel.locator(".jp-CodeCell").nth(n - 2)
    try:
        page.wait_for_function("i => (window.kfLive[i] || 0) >= 2", arg=n - 2, timeout=240_000)
    except Exception:
        raise AssertionError("a blocking optimize() showed no live progress while its cell ran; the notebook:\n"
                             + _notebook_state(lab)) from None
    blocking.locator(".kf-run-progress button[data-action='stop']").click()   # it works while the cell waits
    _wait_idle_after_run(lab, cells=n)
    assert page.evaluate("i => window.kfLive[i] || 0", n - 1) >= 1, "%%kforge optimize showed no live progress"
    # the same view in both: one progress view (the run's end) and the run's one line, nothing else
    kinds = page.evaluate("""cells => cells.map(i => {
      const outputs = window.jupyterapp.shell.currentWidget.content.model.cells.get(i).outputs;
      return [...Array(outputs.length).keys()].map(k => Object.keys(outputs.get(k).data).sort().join(","));
    })""", [n - 2, n - 1])
    assert kinds[0] == kinds[1] and len(kinds[0]) == 2, kinds
    for i in (n - 2, n - 1):
        cell = panel.locator(".jp-CodeCell").nth(i)
        assert cell.locator(".kf-run-progress").count() == 1
        cell.locator(".kf-run-progress .kf-pill[data-status='stopped'], .kf-run-progress .kf-pill[data-status='finished']"
                     ).wait_for(timeout=30_000)
        assert cell.locator(".jp-OutputArea-output", has_text=re.compile(r"^<kforge run (stopped|finished)")).count() == 1
    # the mistakes the CLI knows read as its one line, not a traceback
    for i, (line, said) in enumerate(MAGIC_MISTAKES.items(), start=n):
        _run_cell(page, i)
        cell = panel.locator(".jp-CodeCell").nth(i)
        page.wait_for_function("el => /\\[\\d+\\]/.test(el.textContent)",
                               arg=cell.locator(".jp-InputArea-prompt").element_handle(), timeout=60_000)
        error = cell.locator(".jp-OutputArea-output").first
        error.wait_for(timeout=30_000)
        text = error.inner_text().strip()
        assert text.startswith("UsageError: ") and "\n" not in text, f"{line}: {text}"
        assert re.search(said, text.removeprefix("UsageError: ")), f"{line}: {text}"
    assert panel.locator(".jp-OutputArea-output", has_text="--max-cards").count() >= 1, "per-command help"
    assert panel.locator(".jp-OutputArea-output", has_text="cards captured on cpu").count() == 1
    panel.locator(".kf-card-table tbody tr").first.wait_for(timeout=60_000)
    assert panel.locator(".kf-run-progress").count() >= 1
    assert panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").filter(
        has_text="Traceback").count() == 0
    lab.watch.check()
