"""HTTP: /metrics from a private registry, the landing page at /, and /api/v1/units."""

from __future__ import annotations

import json
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from exporter import landing
from exporter.model import Snapshot
from exporter.report import unit_document

StartResponse = Callable[..., object]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # a scrape every few seconds is no news
        pass


def make_app(registry: CollectorRegistry, snapshot: Callable[[], Snapshot]) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:  # type: ignore[type-arg]
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        if path not in ("/", "/metrics", "/api/v1/units"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; see / for the units, /metrics, /api/v1/units\n"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        if path == "/metrics":
            return metrics(environ, start_response)
        snap = snapshot()
        if path == "/api/v1/units":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps([unit_document(view, snap) for view in snap.units]).encode()]
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [landing.render(snap).encode()]

    return app


def serve(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> tuple[WSGIServer, threading.Thread]:
    """Start serving on a thread; raises OSError when the address cannot be bound."""
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return server, thread
