"""A throwaway JupyterLab server on 127.0.0.1 and Debian's Chromium driven by Playwright."""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
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


# Set (to 1) where the browser test must run, as in CI: a missing browser is then a failure, not a skip.
REQUIRED = "KFORGE_BROWSER_REQUIRED"


def missing() -> str | None:
    """Why the browser test cannot run here, or None. NB: asks this interpreter, not PATH: JupyterLab is
    started as ``sys.executable -m jupyterlab``, whether or not the venv's bin is on PATH."""
    if not Path(CHROMIUM).exists():
        return f"no {CHROMIUM} (run .ci/browser-deps.sh: apt-get install chromium)"
    for module, install in (("playwright.sync_api", "run .ci/browser-deps.sh: pip install playwright"),
                            ("jupyterlab", "pip install 'kforge[notebook]'"),
                            ("ipykernel", "pip install 'kforge[notebook]'")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module.split('.')[0]} is not installed for {sys.executable} ({install})"
    return None


def required() -> bool:
    """Whether a missing browser fails the test instead of skipping it (``KFORGE_BROWSER_REQUIRED=1``)."""
    return os.environ.get(REQUIRED, "") not in ("", "0")


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
    # NB: no API key reaches the kernel: the tutorials take their keyless path and nothing is spent
    keys = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    env = {**{k: v for k, v in os.environ.items() if k not in keys}, "PYTHONPATH": path, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
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
