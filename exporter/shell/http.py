"""HTTP: /metrics, the landing page and /api/v1/units, behind TLS and basic auth."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import ipaddress
import json
import logging
import os
import queue
import secrets
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from exporter.core import landing
from exporter.core.model import Snapshot
from exporter.core.report import unit_document
from exporter.shell.webconfig import Tls, WebConfig, WebConfigError

logger = logging.getLogger(__name__)

StartResponse = Callable[..., object]
App = Callable[..., Iterable[bytes]]

# A client has this long from connect to a complete request head, TLS handshake included, and as long
# again to take its response; a silent or slow one is dropped then. Until its head is complete a
# connection costs a file descriptor and no thread, so idle clients cannot hold the workers.
HEAD_TIMEOUT = 10.0
WRITE_TIMEOUT = 10.0
MAX_HEAD = 16 * 1024
# Connections still handshaking or sending their head; past this the oldest is dropped, so a flood of
# idle connections pushes out its own oldest members rather than the scrape that just arrived.
MAX_PENDING = 512
WORKERS = 4  # render and write: a snapshot renders in milliseconds, so a few are plenty
QUEUED = 64  # complete requests waiting for a worker; past this a request is refused with 503
CHECKS = 8  # requests waiting for a bcrypt check; past this 503, so that guessing cannot queue up work
CACHED = 64  # successful (user, password) checks remembered

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# Python's ssl verifies every certificate it asks for, so the two Go policies that accept any certificate
# differ: RequestClientCert never asks (the certificate would not be used for anything), and
# RequireAnyClientCert requires one signed by client_ca_file, which webconfig insists on.
VERIFY_MODES = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_NONE,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAnyClientCert": ssl.CERT_REQUIRED,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
STATUS_TEXT = {400: "Bad Request", 401: "Unauthorized", 431: "Request Header Fields Too Large",
               500: "Internal Server Error", 503: "Service Unavailable"}


def make_app(metrics: Callable[[], bytes], snapshot: Callable[[], Snapshot]) -> App:
    """The app: /metrics is `metrics()` (an Exposition), the rest renders `snapshot()`."""

    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:  # type: ignore[type-arg]
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        if path not in ("/", "/metrics", "/api/v1/units"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; see / for the units, /metrics, /api/v1/units\n"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        if path == "/metrics":  # HEAD as GET: the server drops the body
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [metrics()]
        snap = snapshot()
        if path == "/api/v1/units":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps([unit_document(view, snap) for view in snap.units]).encode()]
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [landing.render(snap).encode()]

    return app


def tls_context(tls: Tls, web: WebConfig) -> ssl.SSLContext:
    """The server's SSLContext; raises WebConfigError when the certificate and key cannot be used."""
    if b"CERTIFICATE-----" not in tls.cert_pem:
        raise WebConfigError(web.path, f"{tls.cert_source} holds no PEM certificate")
    if b"PRIVATE KEY-----" not in tls.key_pem:
        raise WebConfigError(web.path, f"{tls.key_source} holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    try:
        with _memory_file(tls.cert_pem) as cert, _memory_file(tls.key_pem) as key:
            # An encrypted key would make OpenSSL prompt on the terminal; an empty password fails instead.
            context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise WebConfigError(web.path, f"{tls.key_source} is not the key of {tls.cert_source}") from None
        problem = f"cannot load {tls.cert_source} with {tls.key_source} ({error.reason or error})"
        raise WebConfigError(web.path, problem + "; an encrypted key is not supported") from None
    if tls.client_ca_pem is not None:
        try:
            context.load_verify_locations(cadata=tls.client_ca_pem)
        except (ssl.SSLError, ValueError) as error:
            raise WebConfigError(web.path, f"{tls.client_ca_source} holds no usable CA certificate "
                                           f"({getattr(error, 'reason', None) or error})") from None
    context.verify_mode = VERIFY_MODES[tls.client_auth_type]
    if not tls.prefer_server_cipher_suites:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A PEM as a path OpenSSL can open (/proc/self/fd/N of a memfd): inline and file PEMs load alike,
    and an inline key never touches a disk."""
    fd = os.memfd_create("llmstartup-pem", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _allowed_san(sock: ssl.SSLSocket, allowed: tuple[str, ...]) -> bool:
    """Whether the verified client certificate names one of `allowed` (DNS, IP, e-mail or URI), as in the
    toolkit."""
    wanted = {_normal(a) for a in allowed}
    cert = sock.getpeercert() or {}
    return any(_normal(str(entry[1])) in wanted for entry in cert.get("subjectAltName", ()))  # (type, value)


def _normal(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))  # OpenSSL writes IPv6 SANs uncompressed
    except ValueError:
        return value


class BasicAuth:
    """bcrypt basic auth. A success is remembered (keyed by a keyed hash of user, password and the stored
    hash), so a scrape every few seconds pays bcrypt once; a failure never is, so every guess pays."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        import bcrypt  # here: an agent without basic auth never loads it

        self._checkpw = bcrypt.checkpw
        self.users = users
        # An unknown user is checked against a real hash (the result is ignored), so that the answer takes
        # as long as for a known one and does not tell which users exist.
        self._decoy = next(iter(users.values()))
        self._key = secrets.token_bytes(32)
        self._ok: dict[bytes, None] = {}  # insertion-ordered: the oldest success is forgotten first
        self._lock = threading.Lock()
        self.bcrypt_calls = 0

    @staticmethod
    def credentials(header: str | None) -> tuple[str, bytes] | None:
        """(user, password) from `Authorization: Basic …`, or None when it is missing or malformed."""
        scheme, _, token = (header or "").strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).partition(b":")
            return (user.decode(), password) if sep else None
        except (ValueError, UnicodeDecodeError):
            return None

    def _cache_key(self, user: str, password: bytes) -> bytes:
        stored = self.users.get(user, b"")
        packed = b"".join(len(f).to_bytes(4, "big") + f for f in (user.encode(), password, stored))
        return hashlib.blake2b(packed, key=self._key).digest()

    def cached(self, user: str, password: bytes) -> bool:
        with self._lock:
            return self._cache_key(user, password) in self._ok

    def check(self, user: str, password: bytes) -> bool:
        """Run bcrypt (slow, by design); remember a success."""
        known = user in self.users
        self.bcrypt_calls += 1
        try:
            ok = self._checkpw(password, self.users[user] if known else self._decoy) and known
        except ValueError:  # longer than bcrypt's 72 bytes: it cannot be the password
            ok = False
        if ok:
            key = self._cache_key(user, password)
            with self._lock:
                self._ok[key] = None
                while len(self._ok) > CACHED:
                    del self._ok[next(iter(self._ok))]
        return ok


@dataclass(eq=False)  # a key of the pending dict, by identity
class _Conn:
    sock: socket.socket
    peer: str
    deadline: float
    handshaking: bool  # TLS, until the handshake is done
    head: bytearray
    events: int = selectors.EVENT_READ


@dataclass
class _Request:
    conn: _Conn
    method: str = "GET"
    target: str = "/"
    protocol: str = "HTTP/1.1"
    headers: tuple[tuple[str, str], ...] = ()
    error: int | None = None  # answer with this status instead of running the app
    authorized: bool = False


class Server:
    """Serves a WSGI app with a fixed number of threads.

    One thread owns every connection until its request head is complete: it accepts, runs the TLS
    handshake and reads the head without blocking, and drops a connection that takes longer than
    HEAD_TIMEOUT (or, past MAX_PENDING of them, the oldest). Only a complete request reaches a worker,
    and a worker answers one request per connection. With basic auth, a request whose credentials are
    not remembered goes to the one bcrypt thread first, through a short queue.
    """

    def __init__(self, host: str, port: int, app: App, web: WebConfig | None = None) -> None:
        self.app, self.web = app, web
        self.context = tls_context(web.tls, web) if web and web.tls else None
        self.auth = BasicAuth(web.users) if web and web.users else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pending: dict[_Conn, None] = {}  # accept order, which is deadline order
        self._jobs: queue.Queue[_Request | None] = queue.Queue(QUEUED)
        self._checks: queue.Queue[_Request | None] = queue.Queue(CHECKS)
        self._active: set[socket.socket] = set()  # sockets a worker is answering on
        self._active_lock = threading.Lock()
        self._closing = False
        self._accept_paused_until = 0.0
        self._threads = [threading.Thread(target=self._loop, name="http", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                          for i in range(WORKERS)]
        if self.auth:
            self._threads.append(threading.Thread(target=self._bcrypt, name="http-bcrypt", daemon=True))
        for thread in self._threads:
            thread.start()

    @property
    def port(self) -> int:
        return self.address[1]

    def close(self) -> None:
        """Stop accepting, drop every connection, and join the threads."""
        if self._closing:
            return
        self._closing = True
        self._wake_w.send(b"x")
        self._threads[0].join()
        with self._active_lock:
            for sock in self._active:  # a worker blocked on a slow reader returns at once
                _shutdown(sock)
        if self.auth:  # first, so that it hands no request to a worker that has already stopped
            self._checks.put(None)
            self._threads[-1].join()
        for _ in range(WORKERS):
            self._jobs.put(None)
        for thread in self._threads[1:]:
            thread.join()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    # The connection loop: everything here must return without waiting on a client.

    def _loop(self) -> None:
        while not self._closing:
            now = time.monotonic()
            oldest = next(iter(self._pending), None)
            timeout = 1.0 if oldest is None else min(1.0, max(0.0, oldest.deadline - now))
            if self._accept_paused_until and now >= self._accept_paused_until:
                self._accept_paused_until = 0.0
                self._selector.register(self._listener, selectors.EVENT_READ, "accept")
            for key, _ in self._selector.select(timeout):
                try:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:
                        self._advance(key.data)
                except Exception:  # a bug must cost one connection, not the server
                    logger.exception("HTTP connection loop")
                    if isinstance(key.data, _Conn):
                        self._drop(key.data)
            self._expire(time.monotonic())
        for conn in list(self._pending):
            self._drop(conn)

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, so the pending connections are not starved either
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    continue  # the client gave up before accept (ECONNABORTED): nothing to do
                if self._pending:  # out of descriptors: the oldest idle connection makes room
                    self._drop(next(iter(self._pending)))
                    continue
                logger.warning("cannot accept a connection: %s; pausing for 1s", error.strerror)
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + 1.0
                return
            sock.setblocking(False)
            if self.context:
                try:
                    sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except OSError:  # reset already (wrap_socket asks for the peer's address)
                    sock.close()
                    continue
            tls = self.context is not None
            conn = _Conn(sock, peer[0], time.monotonic() + HEAD_TIMEOUT, handshaking=tls, head=bytearray())
            self._pending[conn] = None
            self._selector.register(sock, selectors.EVENT_READ, conn)
            if len(self._pending) > MAX_PENDING:
                self._drop(next(iter(self._pending)))

    def _advance(self, conn: _Conn) -> None:
        """Take the connection as far as it goes without waiting: handshake, then the request head."""
        try:
            if conn.handshaking:
                conn.sock.do_handshake()  # type: ignore[attr-defined]
                conn.handshaking = False
                allowed = self.web.tls.client_allowed_sans if self.web and self.web.tls else ()
                if allowed and not _allowed_san(conn.sock, allowed):  # type: ignore[arg-type]
                    logger.debug("%s: client certificate names none of client_allowed_sans", conn.peer)
                    self._drop(conn)
                    return
            while True:
                data = conn.sock.recv(65536)
                if not data:
                    self._drop(conn)
                    return
                conn.head += data
                end = _head_end(conn.head)
                if end or len(conn.head) > MAX_HEAD:
                    self._dispatch(_parse(conn, bytes(conn.head[:end])) if end else _Request(conn, error=431))
                    return
        except ssl.SSLWantWriteError:
            self._want(conn, selectors.EVENT_WRITE)
        except (ssl.SSLWantReadError, BlockingIOError):
            self._want(conn, selectors.EVENT_READ)
        except OSError as error:  # ssl.SSLError included: a failed handshake is the client's problem
            logger.debug("%s: dropped: %s", conn.peer, error)
            self._drop(conn)

    def _want(self, conn: _Conn, events: int) -> None:
        if conn.events != events:
            conn.events = events
            self._selector.modify(conn.sock, events, conn)

    def _expire(self, now: float) -> None:
        while self._pending:
            oldest = next(iter(self._pending))
            if oldest.deadline > now:
                return
            logger.debug("%s: no complete request within %gs; dropped", oldest.peer, HEAD_TIMEOUT)
            self._drop(oldest)

    def _release(self, conn: _Conn) -> None:
        self._pending.pop(conn, None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, conn: _Conn) -> None:
        self._release(conn)
        conn.sock.close()

    def _dispatch(self, request: _Request) -> None:
        self._release(request.conn)
        if self.auth and request.error is None:
            found = self.auth.credentials(_header(request, "authorization"))
            if found is None:
                pass  # 401 from the worker
            elif self.auth.cached(*found):
                request.authorized = True
            else:
                try:
                    self._checks.put_nowait(request)
                    return
                except queue.Full:
                    request.error = 503
        try:
            self._jobs.put_nowait(request)
        except queue.Full:
            # Debug, not warning: a flood would otherwise write a line per request to the journal.
            logger.debug("%s: %d requests already wait for a worker; refused", request.conn.peer, QUEUED)
            request.conn.sock.close()

    # The bcrypt thread and the workers.

    def _bcrypt(self) -> None:
        assert self.auth is not None
        while (request := self._checks.get()) is not None:
            found = self.auth.credentials(_header(request, "authorization"))
            request.authorized = found is not None and self.auth.check(*found)
            try:
                self._jobs.put_nowait(request)
            except queue.Full:
                request.conn.sock.close()

    def _work(self) -> None:
        while (request := self._jobs.get()) is not None:
            sock = request.conn.sock
            with self._active_lock:
                if self._closing:
                    sock.close()
                    continue
                self._active.add(sock)
            try:
                _send(sock, self._respond(request), time.monotonic() + WRITE_TIMEOUT)
            except OSError as error:
                logger.debug("%s: response not sent: %s", request.conn.peer, error)
            finally:
                with self._active_lock:
                    self._active.discard(sock)
                _shutdown(sock)
                sock.close()

    def _respond(self, request: _Request) -> bytes:
        """The whole response to one request: status line, headers and body (none for HEAD)."""
        extra = list(self.web.headers) if self.web else []
        if request.error is None and self.auth and not request.authorized:
            request.error = 401
            extra.append(("WWW-Authenticate", 'Basic realm="llmstartup", charset="UTF-8"'))
        if request.error is not None:
            status = f"{request.error} {STATUS_TEXT[request.error]}"
            headers = [("Content-Type", "text/plain")]
            if request.error == 503:
                headers.append(("Retry-After", "1"))
            body = f"{status.lower()[4:]}\n".encode()
        else:
            status, headers, body = self._run_app(request)
        names = {name.lower() for name, _ in headers}
        headers = [h for h in headers if h[0].lower() not in ("connection", "transfer-encoding")] + [
            h for h in extra if h[0].lower() not in names]
        if "content-length" not in names:
            headers.append(("Content-Length", str(len(body))))
        headers.append(("Connection", "close"))  # one request per connection: no idle keep-alive to hold
        head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        return head.encode("latin-1") + (b"" if request.method == "HEAD" else body)

    def _run_app(self, request: _Request) -> tuple[str, list[tuple[str, str]], bytes]:
        started: list[tuple[str, list[tuple[str, str]]]] = []
        written: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> Callable:
            started[:] = [(status, list(headers))]
            return written.append

        try:
            result = self.app(_environ(request, self.address, self.context is not None), start_response)
            try:
                body = b"".join([*written, *result])
            finally:
                if hasattr(result, "close"):
                    result.close()
        except Exception:
            logger.exception("%s %s failed", request.method, request.target)
            return "500 Internal Server Error", [("Content-Type", "text/plain")], b"internal server error\n"
        status, headers = started[0]
        return status, headers, body


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    """sendall with one deadline for the whole response: a client reading a byte now and then cannot
    hold a worker for longer than WRITE_TIMEOUT."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client did not take its response in time")
        sock.settimeout(left)
        view = view[sock.send(view[:65536]):]


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _head_end(data: bytearray) -> int:
    """Where the request head ends (after its blank line), or 0 while it has not."""
    crlf, lf = data.find(b"\r\n\r\n"), data.find(b"\n\n")
    ends = [i + n for i, n in ((crlf, 4), (lf, 2)) if i >= 0]
    return min(ends) if ends else 0


def _parse(conn: _Conn, head: bytes) -> _Request:
    lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        return _Request(conn, error=400)
    headers = []
    for line in filter(None, lines[1:]):
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            return _Request(conn, error=400)  # folded or malformed header lines
        headers.append((name, value.strip()))
    return _Request(conn, parts[0], parts[1], parts[2], tuple(headers))


def _header(request: _Request, name: str) -> str | None:
    return next((v for k, v in request.headers if k.lower() == name), None)


def _environ(request: _Request, address: tuple[str, int], tls: bool) -> dict[str, object]:
    target = request.target
    if target.startswith(("http://", "https://")):
        split = urlsplit(target)
        path, query = split.path or "/", split.query
    else:
        path, _, query = target.partition("?")
    environ: dict[str, object] = {
        "REQUEST_METHOD": request.method, "SCRIPT_NAME": "", "PATH_INFO": unquote(path, "latin-1"),
        "QUERY_STRING": query, "SERVER_NAME": address[0], "SERVER_PORT": str(address[1]),
        "SERVER_PROTOCOL": request.protocol, "REMOTE_ADDR": request.conn.peer,
        "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if tls else "http", "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in request.headers:
        if "_" in name:  # as wsgiref: X_Forwarded_For would pass for X-Forwarded-For in the environ
            continue
        key = name.upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def serve(host: str, port: int, app: App, web: WebConfig | None = None) -> Server:
    """Start serving on threads; raises OSError when the address cannot be bound, WebConfigError when
    the web config's certificate or key cannot be used."""
    server = Server(host, port, app, web)
    if web and web.http2:
        logger.info("%s: http_server_config.http2 is ignored: the server speaks HTTP/1.1, which Prometheus "
                    "falls back to", web.path)
    scheme = "https" if server.context else "http"
    if web:
        logger.info("web config %s: %s%s", web.path, scheme.upper(),
                    f", basic auth for {len(web.users)} user(s)" if web.users else "")
    return server
