"""An in-test HTTP server on 127.0.0.1 whose answers the test scripts, route by route.

Routes map ``(method, path)`` to a :class:`Reply`, a list of replies (served in order, the
last one repeating) or a callable taking the request's JSON body. SSE replies stream
``data:`` events with optional delays and can end without ``[DONE]`` (a truncated stream).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Event = tuple[float, Any]  # (delay before it in seconds, dict payload or raw string)


@dataclass
class Reply:
    status: int = 200
    json_body: Any = None
    text: str | None = None
    events: Sequence[Event] | None = None  # SSE
    done: bool = True  # SSE ends with data: [DONE]
    delay: float = 0.0  # before answering
    content_type: str | None = None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


Route = Reply | list[Reply] | Callable[[Any], Reply]


@dataclass
class ScriptedServer:
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        script = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                script._answer(self, "GET")

            def do_POST(self) -> None:
                script._answer(self, "POST")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def bodies(self, path: str) -> list[Any]:
        return [s.body for s in self.seen if s.path == path]

    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        size = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(size) if size else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode()
        self.seen.append(Seen(method, h.path, dict(h.headers), body))
        route = self.routes.get((method, h.path))
        if route is None:
            reply = Reply(404, {"error": "no route"})
        elif isinstance(route, Reply):
            reply = route
        elif isinstance(route, list):
            reply = route.pop(0) if len(route) > 1 else route[0]
        else:
            reply = route(body)
        time.sleep(reply.delay)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            _send(h, reply)


def _send(h: BaseHTTPRequestHandler, reply: Reply) -> None:
    if reply.events is not None:
        h.send_response(reply.status)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for delay, payload in reply.events:
            time.sleep(delay)
            event = payload if isinstance(payload, str) else json.dumps(payload)
            h.wfile.write(f"data: {event}\n\n".encode())
            h.wfile.flush()
        if reply.done:
            h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()
        h.close_connection = True
        return
    if reply.text is not None:
        data = reply.text.encode()
        ctype = reply.content_type or "text/plain"
    else:
        data = json.dumps(reply.json_body if reply.json_body is not None else {}).encode()
        ctype = reply.content_type or "application/json"
    h.send_response(reply.status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def sglang_routes(generate: Route) -> dict[tuple[str, str], Route]:
    """A healthy SGLang server's routes, /generate answered by ``generate``."""
    return {("GET", "/health"): Reply(json_body={}), ("POST", "/flush_cache"): Reply(json_body={}),
            ("POST", "/generate"): generate}  # fmt: skip
