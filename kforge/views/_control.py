"""The run's control channel: pause / resume / stop over HTTP on 127.0.0.1, without the kernel.

A notebook's kernel reads no widget message while a cell runs (``run.wait()``, a long capture), so
buttons that talk through the kernel die exactly when a user needs them. The progress view starts
this small server in its own thread; the browser posts the action to it directly. It answers only
on 127.0.0.1, only with the random token in its URL, and only the three actions.

Where the browser cannot reach it (a kernel on another machine), a view falls back to the kernel;
:class:`KernelWatch` tells the front end whether a cell is running, so that it says at once that a
message would wait instead of timing out.
"""
from __future__ import annotations

import secrets
import threading
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

ACTIONS = ("pause", "resume", "stop")


class ControlChannel:
    """Serves ``POST /<token>/<action>`` by calling ``act(action)``; the reply is the new state."""

    def __init__(self, act: Callable[[str], str]):
        self._act = act
        self.token = secrets.token_hex(16)
        channel = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(min(length, 1024))  # unread bytes would reset the connection
                parts = self.path.strip("/").split("/")
                if len(parts) != 2 or not secrets.compare_digest(parts[0], channel.token):
                    return self._reply(403, "bad token")
                if parts[1] not in ACTIONS:
                    return self._reply(400, f"unknown action {parts[1]!r}: pause, resume or stop")
                try:
                    state = channel._act(parts[1])
                except Exception as exc:  # the button shows it
                    return self._reply(500, f"{type(exc).__name__}: {exc}")
                self._reply(200, state)

            def _reply(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # no request lines in the notebook
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/{self.token}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="kforge-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (the run is over: nothing left to control)."""
        if self._thread.is_alive():
            def stop() -> None:
                self._server.shutdown()
                self._server.server_close()
            threading.Thread(target=stop, name="kforge-control-close", daemon=True).start()


class KernelWatch:
    """Sets ``kernel_busy`` on the views it watches while IPython runs a cell (kernel-to-browser
    messages flow then; browser-to-kernel ones wait for the cell to end). One per shell."""

    _watches: "weakref.WeakKeyDictionary[Any, KernelWatch]" = weakref.WeakKeyDictionary()

    def __init__(self, shell: Any):
        self.busy = True            # NB: made by a cell, which is running now
        self._views: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()   # a run's thread forgets its views while a cell starts or ends
        shell.events.register("pre_run_cell", self._pre)
        shell.events.register("post_run_cell", self._post)

    @classmethod
    def of_current_shell(cls) -> "KernelWatch | None":
        """The watch of the running IPython shell (made on first use); None outside IPython."""
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        shell = get_ipython()
        if shell is None:
            return None
        if shell not in cls._watches:
            cls._watches[shell] = cls(shell)
        return cls._watches[shell]

    def watch(self, view: Any) -> None:
        with self._lock:
            self._views.add(view)
        view.kernel_busy = self.busy

    def forget(self, view: Any) -> None:
        with self._lock:
            self._views.discard(view)

    def _set(self, busy: bool) -> None:
        self.busy = busy
        with self._lock:
            views = list(self._views)
        for view in views:
            view.kernel_busy = busy

    def _pre(self, *_: Any) -> None:
        self._set(True)

    def _post(self, *_: Any) -> None:
        self._set(False)
