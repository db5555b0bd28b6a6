"""`--web.config.file`: the exporter-toolkit web configuration (TLS, basic auth, headers), parsed."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from exporter.core.model import frozen_map

if TYPE_CHECKING:
    import yaml

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
# Go's tls.ClientAuthType; the toolkit keeps RequireClientCert as an old name of RequireAnyClientCert.
_AUTH_ALIASES = {"RequireClientCert": "RequireAnyClientCert", "": "NoClientCert"}
TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")
# The toolkit allow-lists these headers (and the values of the two that are enumerations), so that a web
# config file cannot set Content-Type or Set-Cookie; the same file must mean the same here.
HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
# $2a$, $2b$ and htpasswd's $2y$, a two-digit cost, then 22 characters of salt and 31 of hash.
BCRYPT = re.compile(r"\$2[aby]?\$(\d\d)\$[./A-Za-z0-9]{53}")

_TLS_KEYS = {"cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file", "client_auth_type",
             "client_allowed_sans", "min_version", "max_version", "prefer_server_cipher_suites"}
# Known to the toolkit, refused here rather than ignored: ignoring them would serve a weaker or
# different policy than the operator wrote.
_UNSUPPORTED = {
    "tls_server_config.cipher_suites": "Go's cipher suite names are not mapped to OpenSSL's here; "
    "remove it to use OpenSSL's default suites",
    "tls_server_config.curve_preferences": "remove it to use OpenSSL's default groups",
    "rate_limit": "llmstartup has no rate limiter; remove it (the server bounds its threads and "
    "connections itself)",
}


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and what is wrong."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


@dataclass(frozen=True, slots=True)
class Tls:
    cert_pem: bytes
    key_pem: bytes
    cert_source: str  # for messages: "cert_file /etc/x.crt" or "cert (inline)"
    key_source: str
    client_auth_type: str = "NoClientCert"
    client_ca_pem: str | None = None
    client_ca_source: str | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True, slots=True)
class WebConfig:
    path: Path
    tls: Tls | None = None  # None: plain HTTP
    users: Mapping[str, bytes] = field(default_factory=frozen_map)  # user → bcrypt hash; empty: no auth
    headers: tuple[tuple[str, str], ...] = ()
    http2: bool | None = None  # accepted for compatibility and ignored: the server speaks HTTP/1.1


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """Safe YAML that refuses a key given twice (a second `basic_auth_users` entry must not win silently).
    Made when first asked, as PyYAML is imported: only an agent given a web config file reads YAML, and
    PyYAML is 1 MiB of a process's memory."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def no_duplicates(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicates)
    return StrictLoader


def load(path: Path) -> WebConfig:
    """Read and check the file; raises WebConfigError. Relative file names are from the file's folder."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise WebConfigError(path, f"cannot read it: {getattr(error, 'strerror', None) or error}") from None
    import yaml

    try:
        return parse(text, path)
    except yaml.YAMLError as error:
        raise WebConfigError(path, f"not valid YAML{_where(error)}") from None


def _where(error: yaml.YAMLError) -> str:
    """One line, and without PyYAML's quote of the offending line: it may hold a secret."""
    import yaml

    if not isinstance(error, yaml.MarkedYAMLError):
        return f": {error}"
    mark = error.problem_mark or error.context_mark
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{at}: {'; '.join(filter(None, (error.context, error.problem)))}"


def parse(text: str, path: Path) -> WebConfig:
    import yaml

    doc = yaml.load(text, Loader=_strict_loader())  # a SafeLoader: no Python objects from the file
    problem = _Problems(path)
    if doc is None:  # an empty file is valid: plain HTTP, no auth, as in the toolkit
        return WebConfig(path)
    top = problem.mapping(doc, "the file", {"tls_server_config", "http_server_config", "basic_auth_users"})
    tls_section = problem.mapping(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS)
    tls = _tls(tls_section, path.parent, problem)
    http = problem.mapping(top.get("http_server_config"), "http_server_config", {"http2", "headers"})
    http2 = http.get("http2")
    if http2 is not None and not isinstance(http2, bool):
        problem(f"http_server_config.http2 must be true or false, not {http2!r}")
    return WebConfig(path, tls, _users(top.get("basic_auth_users"), problem),
                     _headers(http.get("headers"), problem), http2)


class _Problems:
    """Raises WebConfigError for the file; small shape checks shared by every section."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, problem: str) -> NoReturn:
        raise WebConfigError(self.path, problem)

    def mapping(self, value: Any, where: str, keys: set[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self(f"{where} must be a mapping, not {type(value).__name__}")
        for key in value:
            name = key if where == "the file" else f"{where}.{key}"
            if name in _UNSUPPORTED:
                self(f"{name} is not supported: {_UNSUPPORTED[name]}")
            if key not in keys:
                self(f"unknown key {name!r} (known: {', '.join(sorted(keys))})")
        return value

    def string(self, value: Any, where: str) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            self(f"{where} must be a string, not {type(value).__name__}")  # no echo: it may be a key
        return value


def _pem(inline: Any, file: Any, name: str, folder: Path, problem: _Problems) -> tuple[bytes, str] | None:
    """The PEM text of `name` (inline) or `name_file`, with a description for messages."""
    inline = problem.string(inline, f"tls_server_config.{name}")
    file = problem.string(file, f"tls_server_config.{name}_file")
    if inline and file:
        problem(f"tls_server_config has both {name} and {name}_file; give one")
    if inline:
        return inline.encode(), f"{name} (inline)"
    if not file:
        return None
    where = folder / file
    try:
        return where.read_bytes(), f"{name}_file {where}"
    except OSError as error:
        problem(f"tls_server_config.{name}_file {where}: {error.strerror}")


def _tls(section: dict[str, Any], folder: Path, problem: _Problems) -> Tls | None:
    if not section:
        return None
    cert = _pem(section.get("cert"), section.get("cert_file"), "cert", folder, problem)
    key = _pem(section.get("key"), section.get("key_file"), "key", folder, problem)
    ca = _pem(section.get("client_ca"), section.get("client_ca_file"), "client_ca", folder, problem)
    if cert is None:
        problem("tls_server_config needs cert_file (or an inline cert)")
    if key is None:
        problem("tls_server_config needs key_file (or an inline key)")
    auth = section.get("client_auth_type") or ""
    auth = _AUTH_ALIASES.get(auth, auth)
    if auth not in CLIENT_AUTH_TYPES:
        problem(f"tls_server_config.client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}")
    if ca is not None and auth == "NoClientCert":
        problem("tls_server_config has client_ca_file but client_auth_type is NoClientCert; "
                "set client_auth_type: RequireAndVerifyClientCert to check client certificates")
    if ca is None and auth not in ("NoClientCert", "RequestClientCert"):
        problem(f"tls_server_config.client_auth_type {auth} needs client_ca_file: client certificates are "
                "verified against it")
    sans = section.get("client_allowed_sans")
    if sans is not None and (not isinstance(sans, list) or not all(isinstance(s, str) for s in sans)):
        problem("tls_server_config.client_allowed_sans must be a list of strings")
    if sans is not None and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        problem("tls_server_config.client_allowed_sans needs client_auth_type RequireAndVerifyClientCert "
                "(or RequireAnyClientCert): otherwise a client may send no certificate to match")
    versions = []
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = section.get(name) or default
        if value not in TLS_VERSIONS:
            problem(f"tls_server_config.{name} {value!r} is not one of {', '.join(TLS_VERSIONS)}")
        versions.append(value)
    if TLS_VERSIONS.index(versions[0]) > TLS_VERSIONS.index(versions[1]):
        problem(f"tls_server_config.min_version {versions[0]} is above max_version {versions[1]}")
    prefer = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problem(f"tls_server_config.prefer_server_cipher_suites must be true or false, not {prefer!r}")
    return Tls(cert[0], key[0], cert[1], key[1], auth, ca[0].decode("ascii", "replace") if ca else None,
               ca[1] if ca else None, tuple(sans or ()), versions[0], versions[1], prefer)


def _users(section: Any, problem: _Problems) -> Mapping[str, bytes]:
    if section is None:
        return frozen_map()
    if not isinstance(section, dict):
        problem(f"basic_auth_users must be a mapping of user to bcrypt hash, not {type(section).__name__}")
    users = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            problem(f"basic_auth_users: {user!r} is not a user name (a non-empty string without ':')")
        match = BCRYPT.fullmatch(hashed) if isinstance(hashed, str) else None
        if match is None or not 4 <= int(match[1]) <= 31:
            # Never echo the value: it may be a plain password pasted by mistake.
            problem(f"basic_auth_users.{user} is not a bcrypt hash (expected $2y$10$… as "
                    "`htpasswd -nBC 10 \"\" | tr -d ':\\n'` prints)")
        users[user] = hashed.encode()
    return frozen_map(users)


def _headers(section: Any, problem: _Problems) -> tuple[tuple[str, str], ...]:
    if section is None:
        return ()
    if not isinstance(section, dict):
        problem(f"http_server_config.headers must be a mapping, not {type(section).__name__}")
    headers = []
    for name, value in section.items():
        if name not in HEADERS:
            problem(f"http_server_config.headers: {name!r} cannot be set (allowed: {', '.join(HEADERS)})")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            problem(f"http_server_config.headers.{name} must be a one-line string")
        if HEADERS[name] and value not in HEADERS[name]:
            problem(f"http_server_config.headers.{name} {value!r} is not one of {', '.join(HEADERS[name])}")
        if value:  # blank means unset, as in the toolkit
            headers.append((name, value))
    return tuple(headers)
