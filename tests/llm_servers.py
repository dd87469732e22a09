"""Fake LLM servers for tests: real HTTP on 127.0.0.1, the providers' wire formats, scripted replies.

Each server answers requests in order from a script of :class:`Scripted` responses and records
every request it receives, so a test can check what the SDK sent and how often it retried.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Scripted:
    """One response: status, JSON body and headers; ``hang_s`` delays it (to provoke a timeout)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    hang_s: float = 0.0


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeServer:
    """A threaded HTTP server on a free port of 127.0.0.1. Use as a context manager."""

    def __init__(self) -> None:
        self.script: list[Scripted] = []
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.01,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def respond(self, *responses: Scripted) -> "FakeServer":
        self.script.extend(responses)
        return self

    def __enter__(self) -> "FakeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # releases hanging handlers
        self._http.shutdown()
        self._http.server_close()

    def answer(self, request: Received) -> Scripted:
        """The response to ``request``: a protocol error if it is malformed, else the next scripted one."""
        raise NotImplementedError

    def next_scripted(self) -> Scripted:
        with self._lock:
            if not self.script:
                return Scripted(500, {"error": "the test scripted no more responses"})
            return self.script.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                   json.loads(raw) if raw else {})
                with server._lock:
                    server.requests.append(request)
                reply = server.answer(request)
                if reply.hang_s and server._stop.wait(reply.hang_s):
                    return
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = _serve

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


# ----------------------------------------------------------------------------- Anthropic Messages API


class AnthropicServer(FakeServer):
    """POST /v1/messages with an anthropic-version header and the key in x-api-key or, as the
    current SDK sends it, an Authorization bearer header."""

    def answer(self, request: Received) -> Scripted:
        if request.method != "POST" or request.path != "/v1/messages":
            return anthropic_error(404, "not_found_error", f"no route {request.method} {request.path}")
        if not (request.headers.get("x-api-key") or request.headers.get("authorization", "").startswith("Bearer ")):
            return anthropic_error(401, "authentication_error", "x-api-key header is required")
        if not request.headers.get("anthropic-version"):
            return anthropic_error(400, "invalid_request_error", "anthropic-version header is required")
        missing = {"model", "max_tokens", "messages"} - set(request.body)
        if missing:
            return anthropic_error(400, "invalid_request_error", f"missing fields {sorted(missing)}")
        return self.next_scripted()


def anthropic_message(text: str, *, stop_reason: str = "end_turn", model: str = "claude-sonnet-5-5",
                      input_tokens: int = 1000, output_tokens: int = 500, cache_write: int = 0,
                      cache_read: int = 0) -> Scripted:
    return Scripted(200, {
        "id": "msg_01TestTestTestTestTestTest", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read},
    })


def anthropic_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                    hang_s: float = 0.0) -> Scripted:
    return Scripted(status, {"type": "error", "error": {"type": kind, "message": message},
                             "request_id": "req_test"}, headers or {}, hang_s)


# ----------------------------------------------------------------------------- OpenAI Chat Completions


class OpenAIServer(FakeServer):
    """POST /v1/chat/completions and GET /v1/models, bearer authorization."""

    def __init__(self, models: tuple[str, ...] = ("qwen2.5-coder-32b-instruct",)) -> None:
        super().__init__()
        self.models = models

    def answer(self, request: Received) -> Scripted:
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return openai_error(401, "invalid_request_error", "missing bearer token")
        if request.method == "GET" and request.path == "/v1/models":
            return Scripted(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 1700000000, "owned_by": "test"} for m in self.models]})
        if request.method != "POST" or request.path != "/v1/chat/completions":
            return openai_error(404, "invalid_request_error", f"no route {request.method} {request.path}")
        missing = {"model", "messages"} - set(request.body)
        if missing:
            return openai_error(400, "invalid_request_error", f"missing fields {sorted(missing)}")
        return self.next_scripted()


def openai_completion(text: str | None, *, finish_reason: str = "stop", model: str = "gpt-6.1-sol",
                      prompt_tokens: int = 1000, completion_tokens: int = 500, cached_tokens: int = 0,
                      refusal: str | None = None) -> Scripted:
    return Scripted(200, {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000, "model": model,
        "choices": [{"index": 0, "finish_reason": finish_reason, "logprobs": None,
                     "message": {"role": "assistant", "content": text, "refusal": refusal}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": cached_tokens}},
    })


def openai_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                 hang_s: float = 0.0) -> Scripted:
    return Scripted(status, {"error": {"message": message, "type": kind, "param": None, "code": None}},
                    headers or {}, hang_s)
