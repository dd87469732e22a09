"""A throwaway JupyterLab server on 127.0.0.1 and Debian's Chromium driven by Playwright."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run",
                 # resolve no outside host: a request that leaves 127.0.0.1 fails (and the test sees it)
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                 "--disable-features=AutofillServerCommunication,MediaRouter,OptimizationHints"]
# Quiet, deterministic JupyterLab: no news or update checks, every cell kept in the DOM.
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no {CHROMIUM} (run .ci/browser-deps.sh: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (run .ci/browser-deps.sh: pip install playwright)"
    if shutil.which("jupyter-lab") is None and shutil.which("jupyter") is None:
        return "jupyterlab is not installed (pip install 'kforge[notebook]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyterlab(root: Path, timeout: float = 60.0, home: Path | None = None) -> Iterator[str]:
    """Serve ``root`` with JupyterLab; yields the base URL with its token query.

    ``home`` holds its config, settings and data (the notebook-signing secret too): another home
    is another machine, where a saved notebook is untrusted.
    """
    port, token = _free_port(), secrets.token_hex(16)
    home = home or root.parent / "jupyter-home"
    settings = home / "settings"
    for name, body in SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body))
    # NB: the kernel imports the kforge of this checkout (as pytest does), not whichever one is installed
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "IPYTHONDIR": str(home / "ipython")}
    log = open(home.parent / f"jupyterlab-{home.name}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0", "--allow-root",
         "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabServerApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"JupyterLab did not start; see {log.name}") from None
                time.sleep(0.5)
        yield f"{base}/lab/tree/{{path}}?token={token}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextmanager
def chromium(user_data_dir: Path) -> Iterator[object]:
    """A headless Chromium page (Debian's binary, fresh profile, no background traffic, no outside host)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(user_data_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1440, "height": 1500}, device_scale_factor=1)
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
