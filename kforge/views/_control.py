"""The run's control channel: pause / resume / stop over HTTP on 127.0.0.1, without the kernel.

A notebook's kernel reads no widget message while a cell runs (``run.wait()``, a long capture), so
buttons that talk through the kernel die exactly when a user needs them. The progress view starts
this small server in its own thread; the browser posts the action to it directly. It answers only
on 127.0.0.1, only with the random token in its URL, and only the three actions.
"""
from __future__ import annotations

import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

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
