"""The HTTP server: --web.config.file (TLS, client certificates, basic auth, headers) and hostile clients.

The server runs in-process through exporter.shell.http, with the real app on a private registry; the flag
itself is checked through the real `llmstartup serve`. Certificates come from a throwaway CA made here.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CollectorRegistry, Counter, generate_latest

from exporter.shell import http as web_http
from exporter.shell import webconfig
from exporter.shell.http import make_app, serve
from exporter.core.model import Snapshot
from tests.scrape import free_port, wait_for

PASSWORD = "s3cret-scrape"
# Cost 4, the lowest: the tests count bcrypt calls, they do not time them.
ALICE = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)  # as htpasswd


# A throwaway PKI: a CA, a server certificate for 127.0.0.1, a client certificate it signed, and a
# client certificate from another CA.

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


Key = ec.EllipticCurvePrivateKey


def _cert(subject: str, key: Key, issuer: tuple[x509.Certificate, Key] | None, ca: bool = False,
          sans: list[x509.GeneralName] | None = None, usage: x509.ObjectIdentifier | None = None
          ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    issuer_name, issuer_key = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - day).not_valid_after(now + day)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = _cert("test CA", ca_key, None, ca=True)
        other_ca = _cert("another CA", other_key, None, ca=True)
        self.ca = self._write("ca.crt", ca)
        server_key = ec.generate_private_key(ec.SECP256R1())
        self.server = self._write("server.crt", _cert(
            "127.0.0.1", server_key, (ca, ca_key),
            sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
            usage=ExtendedKeyUsageOID.SERVER_AUTH))
        self.server_key = self._write("server.key", server_key)
        self.unrelated_key = self._write("unrelated.key", ec.generate_private_key(ec.SECP256R1()))
        client_key = ec.generate_private_key(ec.SECP256R1())
        self.client = self._write("client.crt", _cert("prometheus", client_key, (ca, ca_key),
                                                      sans=[x509.DNSName("prometheus.example")],
                                                      usage=ExtendedKeyUsageOID.CLIENT_AUTH))
        self.client_key = self._write("client.key", client_key)
        stranger_key = ec.generate_private_key(ec.SECP256R1())
        self.stranger = self._write("stranger.crt", _cert("stranger", stranger_key, (other_ca, other_key),
                                                          sans=[x509.DNSName("prometheus.example")],
                                                          usage=ExtendedKeyUsageOID.CLIENT_AUTH))
        self.stranger_key = self._write("stranger.key", stranger_key)

    def _write(self, name: str, item: x509.Certificate | ec.EllipticCurvePrivateKey) -> Path:
        path = self.folder / name
        if isinstance(item, x509.Certificate):
            path.write_bytes(item.public_bytes(serialization.Encoding.PEM))
        else:
            path.write_bytes(item.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
        return path

    def client_context(self, cert: str | None = None, max_version: ssl.TLSVersion | None = None
                       ) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if max_version:
            context.maximum_version = max_version
        if cert:
            context.load_cert_chain(self.folder / f"{cert}.crt", self.folder / f"{cert}.key")
        return context

    def tls(self, extra: str = "") -> str:
        return f"tls_server_config:\n  cert_file: {self.server}\n  key_file: {self.server_key}\n{extra}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def _app() -> Callable:
    registry = CollectorRegistry()
    Counter("llmstartup_test_scrapes", "a series for the test to find", registry=registry).inc()
    return make_app(lambda: generate_latest(registry), lambda: Snapshot(time.monotonic(), time.time() - time.monotonic()))


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("http")]


@pytest.fixture
def start(tmp_path) -> Iterator[Callable[[str], web_http.Server]]:
    """`start(yaml) -> Server`: the real server on a free loopback port with that web config; closed after."""
    servers: list[web_http.Server] = []

    def run(text: str | None) -> web_http.Server:
        web = None
        if text is not None:
            path = tmp_path / f"web-{len(servers)}.yml"
            path.write_text(text)
            web = webconfig.load(path)
        servers.append(serve("127.0.0.1", 0, _app(), web))
        return servers[-1]

    yield run
    for server in servers:
        server.close()
    assert not _server_threads(), "the server left threads behind"


class Reply:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status, self.headers, self.body = response.status, response.headers, response.read()


def request(server: web_http.Server, path: str = "/metrics", method: str = "GET",
            context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None,
            headers: dict[str, str] | None = None, timeout: float = 5) -> Reply:
    """One request on a fresh connection; raises OSError (ssl.SSLError too) or HTTPException when refused."""
    conn: http.client.HTTPConnection
    if context:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=timeout)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    headers = dict(headers or {})
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        conn.request(method, path, headers=headers)
        return Reply(conn.getresponse())
    finally:
        conn.close()


def refused(call: Callable[[], Reply]) -> bool:
    try:
        call()
    except (OSError, http.client.HTTPException):
        return True
    return False


def _unanswered(sockets: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has neither answered nor closed yet."""
    readable, _, _ = select.select(sockets, [], [], 0)
    return [sock for sock in sockets if sock not in readable]


# TLS


def test_tls_scrape(start, pki):
    server = start(pki.tls())
    reply = request(server, context=pki.client_context())
    assert reply.status == 200
    assert b"llmstartup_test_scrapes_total 1.0" in reply.body
    assert refused(lambda: request(server)), "plain HTTP on the TLS port must not be answered"


def test_inline_certificate_and_key(start, pki):
    def block(path: Path) -> str:
        return "\n".join("    " + line for line in path.read_text().splitlines())

    server = start(f"tls_server_config:\n  cert: |\n{block(pki.server)}\n  key: |\n{block(pki.server_key)}\n")
    assert request(server, context=pki.client_context()).status == 200


def test_tls13_only_refuses_a_tls12_client(start, pki):
    server = start(pki.tls("  min_version: TLS13\n"))
    with pytest.raises(ssl.SSLError):
        request(server, context=pki.client_context(max_version=ssl.TLSVersion.TLSv1_2))
    assert request(server, context=pki.client_context()).status == 200


def test_tls12_max_version_still_serves(start, pki):
    server = start(pki.tls("  max_version: TLS12\n"))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=pki.client_context(), timeout=5)
    try:
        conn.request("GET", "/metrics")
        assert conn.sock.version() == "TLSv1.2"
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_client_certificate_required(start, pki):
    server = start(pki.tls(f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"))
    assert refused(lambda: request(server, context=pki.client_context())), "no certificate"
    assert refused(lambda: request(server, context=pki.client_context("stranger"))), "another CA's"
    assert request(server, context=pki.client_context("client")).status == 200


def test_client_allowed_sans(start, pki):
    tls = f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
    allowed = start(pki.tls(tls + "  client_allowed_sans: [prometheus.example]\n"))
    assert request(allowed, context=pki.client_context("client")).status == 200
    other = start(pki.tls(tls + "  client_allowed_sans: [grafana.example]\n"))
    assert refused(lambda: request(other, context=pki.client_context("client")))


def test_client_certificate_if_given(start, pki):
    server = start(pki.tls(f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {pki.ca}\n"))
    assert request(server, context=pki.client_context()).status == 200
    assert request(server, context=pki.client_context("client")).status == 200
    assert refused(lambda: request(server, context=pki.client_context("stranger")))


@pytest.mark.parametrize(
    ("mode", "with_ca", "answered"),
    [
        pytest.param("RequestClientCert", False, {None: True, "stranger": True, "client": True},
                     id="RequestClientCert: never asks, so any client"),
        pytest.param("RequireAnyClientCert", True, {None: False, "stranger": False, "client": True},
                     id="RequireAnyClientCert: one signed by client_ca_file (Python's ssl verifies what it asks for)"),
        pytest.param("RequireClientCert", True, {None: False, "stranger": False, "client": True},
                     id="RequireClientCert: the toolkit's old name of RequireAnyClientCert"),
    ],
)
def test_client_auth_modes(start, pki, mode, with_ca, answered):
    server = start(pki.tls(f"  client_auth_type: {mode}\n" + (f"  client_ca_file: {pki.ca}\n" if with_ca else "")))
    for cert, ok in answered.items():
        assert refused(lambda: request(server, context=pki.client_context(cert))) is not ok, (mode, cert)


# Basic auth


def test_basic_auth(start):
    server = start(f"basic_auth_users:\n  alice: {ALICE}\n")
    assert request(server, auth=("alice", PASSWORD)).status == 200
    for auth, headers in [(("alice", "wrong"), None), (("bob", PASSWORD), None), (None, None),
                          (None, {"Authorization": "Basic !!!"}), (None, {"Authorization": "Bearer x"})]:
        reply = request(server, auth=auth, headers=headers)
        assert reply.status == 401, (auth, headers)
        assert reply.headers["WWW-Authenticate"].startswith("Basic ")
        assert b"llmstartup_test" not in reply.body
    # Authentication comes before routing: an unknown path tells nothing to a stranger.
    assert request(server, "/nope").status == 401
    assert request(server, "/nope", auth=("alice", PASSWORD)).status == 404


def test_bcrypt_runs_once_per_credentials(start, monkeypatch):
    calls: list[bytes] = []
    checkpw = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    server = start(f"basic_auth_users:\n  alice: {ALICE}\n")
    for _ in range(5):
        assert request(server, auth=("alice", PASSWORD)).status == 200
    assert len(calls) == 1, "a success is remembered"
    for _ in range(3):
        assert request(server, auth=("alice", "guess")).status == 401
    assert len(calls) == 4, "a failure is not: every guess pays bcrypt"
    assert request(server, auth=("mallory", "guess")).status == 401
    assert len(calls) == 5, "an unknown user pays bcrypt too, so timing does not tell which users exist"
    assert request(server, auth=("alice", PASSWORD)).status == 200
    assert len(calls) == 5


def test_password_guessing_does_not_delay_a_remembered_scrape(start, sockets):
    # Cost 11, a tenth of a second or more a check: guesses queue up for the one bcrypt thread, or get 503.
    slow = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(11)).decode()
    server = start(f"basic_auth_users:\n  alice: {slow}\n")
    assert request(server, auth=("alice", PASSWORD)).status == 200
    guess = base64.b64encode(b"alice:guess").decode()
    for _ in range(50):
        sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        sockets[-1].sendall(f"GET /metrics HTTP/1.1\r\nAuthorization: Basic {guess}\r\n\r\n".encode())
    assert request(server, auth=("alice", PASSWORD), timeout=30).status == 200
    # answered ahead of the guesses: some are still waiting their turn at bcrypt (how fast: bench/web.py)
    assert _unanswered(sockets), "the scrape waited for every guess to be checked"
    answers = [sock.recv(12) for sock in sockets]
    assert {a[9:12] for a in answers} == {b"401", b"503"}, "the excess guesses are refused, not queued"


def test_tls_and_basic_auth_together(start, pki):
    server = start(pki.tls() + f"basic_auth_users:\n  alice: {ALICE}\n")
    assert request(server, context=pki.client_context()).status == 401
    assert request(server, context=pki.client_context(), auth=("alice", PASSWORD)).status == 200


# Headers, routes, methods


def test_configured_headers(start):
    server = start("http_server_config:\n  http2: false\n  headers:\n"
                   "    X-Frame-Options: deny\n"
                   "    X-Content-Type-Options: nosniff\n"
                   "    Content-Security-Policy: \"default-src 'self'\"\n"
                   "    Strict-Transport-Security: ''\n")
    for path, status in [("/metrics", 200), ("/", 200), ("/nope", 404)]:
        reply = request(server, path)
        assert reply.status == status
        assert reply.headers["X-Frame-Options"] == "deny"
        assert reply.headers["X-Content-Type-Options"] == "nosniff"
        assert reply.headers["Content-Security-Policy"] == "default-src 'self'"
        assert "Strict-Transport-Security" not in reply.headers, "a blank value leaves the header unset"


def test_routes_methods_and_head(start):
    server = start(None)
    assert request(server, "/nope").status == 404
    reply = request(server, "/metrics", method="POST")
    assert reply.status == 405 and reply.headers["Allow"] == "GET, HEAD"
    assert request(server, "/", method="DELETE").status == 405
    get, head = request(server, "/metrics"), request(server, "/metrics", method="HEAD")
    assert head.status == 200 and head.body == b""
    assert int(head.headers["Content-Length"]) == len(get.body) > 0
    assert head.headers["Content-Type"] == get.headers["Content-Type"]
    assert request(server, "/", method="HEAD").status == 200
    assert request(server, "/api/v1/units").body == b"[]"
    assert request(server, "/metrics?name[]=llmstartup_test_scrapes_total").status == 200


def test_malformed_requests(start):
    server = start(None)
    for raw, status in [(b"NONSENSE\r\n\r\n", b"400"), (b"GET /metrics HTTP/9.9\r\n\r\n", b"400"),
                        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000, b"431")]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(raw)
            assert sock.recv(100).split(b" ")[1] == status


# Hostile clients


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _half_client_hello() -> bytes:
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    return hello[: len(hello) // 2]


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_silent_and_stalled_clients_do_not_delay_a_scrape(start, pki, sockets):
    server = start(pki.tls())
    assert request(server, context=pki.client_context()).status == 200
    threads = _thread_count()
    half_hello = _half_client_hello()
    client_tls = pki.client_context()
    for i in range(300):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sockets.append(sock)
        if 200 <= i < 250:  # a TLS client that never sends its ClientHello
            sockets[-1] = client_tls.wrap_socket(sock, server_hostname="127.0.0.1",
                                                 do_handshake_on_connect=False)
        elif i >= 250:  # one that stops halfway through it
            sock.sendall(half_hello)
    reply = request(server, context=pki.client_context(), timeout=30)
    assert reply.status == 200
    assert len(_unanswered(sockets)) == len(sockets), "answered while the attack runs: every attacker still held"
    assert _thread_count() <= threads + 1, "connections must not spawn threads"


def test_half_open_requests_do_not_delay_a_scrape(start, sockets):
    server = start(None)
    threads = _thread_count()
    for _ in range(300):  # slowloris: a request head that never ends
        sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        sockets[-1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    assert request(server, timeout=30).status == 200
    assert len(_unanswered(sockets)) == len(sockets), "answered while the attack runs: every attacker still held"
    assert _thread_count() <= threads + 1


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_silent_clients_are_dropped_after_the_head_timeout(start, sockets, monkeypatch):
    monkeypatch.setattr(web_http, "HEAD_TIMEOUT", 0.5)
    server = start(None)
    sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
    sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
    sockets[1].sendall(b"GET /metrics HTTP/1.1\r\n")
    wait_for(lambda: all(_closed_by_server(s) for s in sockets), 5, "the server to drop the silent clients")


def test_a_flood_pushes_out_its_own_oldest_connections(start, sockets, monkeypatch):
    monkeypatch.setattr(web_http, "MAX_PENDING", 20)
    server = start(None)
    for _ in range(40):
        sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
    wait_for(lambda: all(_closed_by_server(s) for s in sockets[:20]), 5, "the oldest 20 to be dropped")
    assert request(server, timeout=3).status == 200
    assert not any(_closed_by_server(s) for s in sockets[-5:]), "the newest are kept"


# The flag, through the real command


def _serve(web_config: Path, port: int, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The real `llmstartup serve` with this web config, its log in a file (a pipe nobody reads can fill)."""
    journal, log = tmp_path / "journal", tmp_path / "serve.log"
    journal.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "exporter", "serve", "--web.config.file", str(web_config),
            "--web.listen-address", f"127.0.0.1:{port}", "--journal.directory", str(journal),
            "--no-collector.gpu", "--state.path", str(tmp_path / "state.db")]
    with open(log, "w") as stderr:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr), log


def test_serve_with_web_config_file(pki, tmp_path):
    config = tmp_path / "web.yml"
    # Relative names are relative to the file's folder, as in the toolkit.
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes((pki.folder / name).read_bytes())
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                      "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
                      f"basic_auth_users:\n  alice: {ALICE}\n")
    port = free_port()
    process, log = _serve(config, port, tmp_path)
    target = type("Target", (), {"port": port})
    try:
        def started() -> bool:
            assert process.poll() is None, log.read_text()
            return "serving on" in log.read_text()  # logged once SIGTERM stops it cleanly

        wait_for(started, 15, "llmstartup serve to start")
        reply = request(target, context=pki.client_context("client"), auth=("alice", PASSWORD))
        assert reply.status == 200 and b"llmstartup_" in reply.body
        assert refused(lambda: request(target, context=pki.client_context(), auth=("alice", PASSWORD)))
        assert request(target, context=pki.client_context("client"), auth=("alice", "no")).status == 401
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert process.returncode == 0, log.read_text()
    assert f"web config {config}: HTTPS, basic auth for 1 user(s)" in log.read_text()


TLS = "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
BAD = {  # case: (the file, or None for none; what the error says)
    "unreadable": (None, "cannot read it: No such file or directory"),
    "invalid YAML": ("tls_server_config: [unclosed\n", "not valid YAML at line 2, column 1"),
    "not a mapping": ("- a list\n", "the file must be a mapping"),
    "unknown key": ("tls_server_config:\n  certfile: x\n", "unknown key 'tls_server_config.certfile'"),
    "unknown top-level key": ("basic_auth:\n  alice: x\n", "unknown key 'basic_auth'"),
    "twice the same user": ("basic_auth_users:\n  alice: {h}\n  alice: {h}\n", "key 'alice' is given twice"),
    "missing cert": ("tls_server_config:\n  cert_file: {dir}/missing.crt\n  key_file: {key}\n",
                     "tls_server_config.cert_file {dir}/missing.crt: No such file or directory"),
    "no key": ("tls_server_config:\n  cert_file: {cert}\n", "needs key_file"),
    "key not matching cert": ("tls_server_config:\n  cert_file: {cert}\n  key_file: {unrelated}\n",
                              "key_file {unrelated} is not the key of cert_file {cert}"),
    "not a certificate": ("tls_server_config:\n  cert_file: {key}\n  key_file: {key}\n",
                          "cert_file {key} holds no PEM certificate"),
    "bad client_auth_type": (TLS + "  client_auth_type: RequireSomething\n",
                             "client_auth_type 'RequireSomething' is not one of NoClientCert"),
    "client auth without a CA": (TLS + "  client_auth_type: RequireAndVerifyClientCert\n",
                                 "needs client_ca_file"),
    "a CA but no client auth": (TLS + "  client_ca_file: {ca}\n", "client_auth_type is NoClientCert"),
    "bad TLS version": (TLS + "  min_version: TLS14\n", "min_version 'TLS14' is not one of"),
    "min above max": (TLS + "  min_version: TLS13\n  max_version: TLS12\n",
                      "min_version TLS13 is above max_version TLS12"),
    "plain password": ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice is not a bcrypt"),
    "header not allowed": ("http_server_config:\n  headers:\n    Set-Cookie: a=b\n",
                           "'Set-Cookie' cannot be set"),
    "bad header value": ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
                         "X-Frame-Options 'allow' is not one of deny, sameorigin"),
    "unsupported rate_limit": ("rate_limit:\n  interval: 1s\n  burst: 5\n", "rate_limit is not supported"),
    "unsupported cipher_suites": (TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
                                  "cipher_suites is not supported"),
    "unsupported curve_preferences": (TLS + "  curve_preferences: [X25519]\n", "curve_preferences is not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_web_config_file_stops_serve(case, pki, tmp_path):
    text, expected = BAD[case]
    config = tmp_path / "web.yml"
    names = {"dir": tmp_path, "cert": pki.server, "key": pki.server_key, "unrelated": pki.unrelated_key,
             "ca": pki.ca, "h": ALICE}
    if text is not None:
        config.write_text(text.format(**names))
    process, log = _serve(config, free_port(), tmp_path)
    try:
        process.wait(timeout=20)
    finally:
        process.kill()
    err = log.read_text()
    assert process.returncode == 1, err
    assert f"--web.config.file {config}: " in err and expected.format(**names) in err, err
    assert "Traceback" not in err
    assert "hunter2" not in err, "a password pasted in place of its hash is not echoed"
