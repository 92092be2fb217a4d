"""A small HTTP server of the test's own on 127.0.0.1, for answers a real server never gives
(HTML, truncated JSON, hangs, 401) and for services this machine lacks (Ollama)."""

from __future__ import annotations

import http.server
import json
import threading

#: llama-server answers (b11434's shapes: tools/server/server-context.cpp) for a server of the test's own
SLOTS = [
    {
        "id": 0,
        "n_ctx": 1024,
        "speculative": False,
        "is_processing": True,
        "id_task": 7,
        "n_prompt_tokens": 300,
        "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": 50, "n_decoded": 40}],
    },
    # an older build's shape: next_token an object
    {
        "id": 1,
        "n_ctx": 1024,
        "is_processing": False,
        "id_task": 3,
        "n_prompt_tokens": 20,
        "next_token": {"has_next_token": False, "n_remain": 0, "n_decoded": 12},
    },
]
PROPS = {
    "model_path": "/nowhere/model.gguf",
    "total_slots": 2,
    "default_generation_settings": {"n_ctx": 1024},
    "build_info": "b11434-test",
    "endpoint_metrics": True,
}
METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
llamacpp:prompt_seconds_total 1
llamacpp:tokens_predicted_total 200
llamacpp:tokens_predicted_seconds_total 10
llamacpp:requests_processing 1
llamacpp:requests_deferred 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 0
"""


class Handler(http.server.BaseHTTPRequestHandler):
    """Answers what ``self.server.routes[path]`` says: ``(status, content type, body)`` (and a
    dict of more headers), or a callable that returns it (it may sleep)."""

    def log_message(self, *a):  # quiet
        pass

    def do_GET(self):
        self.server.hits.append((self.path, self.headers.get("Authorization")))
        route = self.server.routes.get(self.path.split("?")[0])
        if callable(route):
            route = route(self)
        if route is None:
            route = (404, "text/plain", b"not found")
        status, ctype, body, *extra = route
        if isinstance(body, str):
            body = body.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra[0] if extra else {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


class Server:
    """A threading HTTP server on a free 127.0.0.1 port answering ``routes`` (path ->
    ``(status, content type, body)`` or a callable of the request handler returning it; change
    ``httpd.routes`` to change the answers); ``hits`` lists ``(path, Authorization)`` asked."""

    def __init__(self, routes):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.routes = routes
        self.httpd.hits = []
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def hits(self):
        return self.httpd.hits

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def ok_json(obj):
    """A 200 JSON answer of ``obj``."""
    return (200, "application/json", json.dumps(obj))


def good_routes():
    """The routes of a healthy llama-server with two slots (one generating) and --metrics."""
    return {
        "/health": ok_json({"status": "ok"}),
        "/props": ok_json(PROPS),
        "/slots": ok_json(SLOTS),
        "/metrics": (200, "text/plain; version=0.0.4", METRICS),
    }
