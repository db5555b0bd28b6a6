"""HTTP: /metrics from a private registry, and a plain landing page at /."""

from __future__ import annotations

import html
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from exporter import __version__
from exporter.model import Snapshot

StartResponse = Callable[..., object]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # a scrape every few seconds is no news
        pass


def _landing(snapshot: Snapshot) -> bytes:
    rows = "".join(
        f"<tr><td>{html.escape(v.state.unit)}</td><td>{html.escape(v.state.engine)}</td>"
        f"<td>{v.state.phase}</td><td>{v.verdict}</td></tr>"
        for v in snapshot.units
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>llmstartup</title></head><body>"
        f"<h1>llmstartup {__version__}</h1><p><a href='/metrics'>Metrics</a></p>"
        f"<table><tr><th>unit</th><th>engine</th><th>phase</th><th>verdict</th></tr>{rows}</table>"
        f"</body></html>"
    ).encode()


def make_app(registry: CollectorRegistry, snapshot: Callable[[], Snapshot]) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:  # type: ignore[type-arg]
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        if path not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; see /metrics\n"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        if path == "/metrics":
            return metrics(environ, start_response)
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [_landing(snapshot())]

    return app


def serve(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> tuple[WSGIServer, threading.Thread]:
    """Start serving on a thread; raises OSError when the address cannot be bound."""
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread
