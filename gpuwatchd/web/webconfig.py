"""The web config file: TLS and basic auth for the HTTP endpoints, in the Prometheus exporter-toolkit format.

The same file node_exporter, Prometheus and Alertmanager read with ``--web.config.file``::

    tls_server_config:
      cert_file: /etc/gpuwatchd/tls.crt
      key_file: /etc/gpuwatchd/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: /etc/gpuwatchd/clients-ca.crt
      min_version: TLS12                              # TLS10..TLS13, default TLS12 as in the toolkit
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\n')

Keys of the format that the Python standard ``ssl`` module cannot honour (``cipher_suites``,
``curve_preferences``, the client-auth modes that accept an unverified certificate...) are refused by name rather
than ignored: a security setting must never be silently dropped. Errors name the key: ``tls_server_config.cert_file:
file not found``.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from gpuwatchd.config.files import InputFileError, read_text_file, shown_path
from gpuwatchd.config.safe_yaml import load_yaml
from gpuwatchd.config.types import SafePath, Section, ValidationError, validate, yaml_error_message

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# exporter-toolkit's client_auth_type values the ssl module can enforce; RequestClientCert and
# RequireAnyClientCert accept a certificate without verifying it, which OpenSSL's server side here cannot express.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# bcrypt's modular-crypt prefixes (htpasswd writes $2y$, Go's bcrypt $2a$, Python's $2b$).
BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
# $2y$10$ + 22 characters of salt + 31 of hash, in bcrypt's base64 alphabet.
_BCRYPT = re.compile(r"\$2[aby]\$([0-9]{2})\$[./A-Za-z0-9]{53}")
# bcrypt's own minimum; and the most a check may cost: each step doubles it (cost 10 is ~0.1 s of a core, 12 ~0.4 s,
# 17 ~14 s), and a check runs for every request of a client that is not yet cached, wrong passwords included.
MIN_BCRYPT_COST = 4
MAX_BCRYPT_COST = 12


class WebConfigError(Exception):
    """A web config file that cannot be used; ``str`` is ``key.path: message`` lines without the file name."""


def _readable(v: Path | None) -> Path | None:
    if v is not None:
        try:
            read_text_file(v)
        except InputFileError as e:
            raise ValueError(f"{shown_path(v)}: {e}") from None
    return v


class TlsServerConfig(Section, frozen=True):
    cert_file: SafePath
    key_file: SafePath
    client_auth_type: Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = "NoClientCert"
    client_ca_file: SafePath | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"

    @classmethod
    def _check_cert_file(cls, v: Path | None, data: dict[str, Any]) -> Path | None:
        return _readable(v)

    _check_key_file = _check_cert_file
    _check_client_ca_file = _check_cert_file

    def check(self) -> None:
        if self.client_auth_type != "NoClientCert" and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            raise ValueError("min_version must not be above max_version")


class WebConfig(Section, frozen=True):
    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = msgspec.field(default_factory=dict)

    @classmethod
    def _check_basic_auth_users(cls, v: dict[str, str], data: dict[str, Any]) -> dict[str, str]:
        for user, hashed in v.items():
            if not user or ":" in user:
                raise ValueError(f"user {user!r}: must be non-empty and without ':' (HTTP basic auth)")
            m = _BCRYPT.fullmatch(hashed)
            if not hashed.startswith(BCRYPT_PREFIXES) or len(hashed) != 60 or m is None:
                raise ValueError(f"user {user!r}: not a bcrypt hash (60 characters starting $2y$, $2a$ or $2b$,"
                                 " a 2-digit cost, then 53 of ./A-Za-z0-9)")
            cost = int(m.group(1))
            if not MIN_BCRYPT_COST <= cost <= MAX_BCRYPT_COST:
                raise ValueError(f"user {user!r}: bcrypt cost {cost} is outside {MIN_BCRYPT_COST}..{MAX_BCRYPT_COST}"
                                 f" (each check at cost {cost} would take ~{0.1 * 2.0 ** (cost - 10):.2g} s of CPU;"
                                 " htpasswd -nBC 10 makes a cost-10 hash)")
        return v

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server TLS context, or None for plain HTTP. Raises WebConfigError when OpenSSL refuses the files."""
        tls = self.tls_server_config
        if tls is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
        ctx.maximum_version = TLS_VERSIONS[tls.max_version]
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except (ssl.SSLError, OSError) as e:
            raise WebConfigError(f"tls_server_config.cert_file: cannot load certificate and key: {e}") from None
        ctx.verify_mode = CLIENT_AUTH[tls.client_auth_type]
        if tls.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=tls.client_ca_file)
            except (ssl.SSLError, OSError) as e:
                raise WebConfigError(f"tls_server_config.client_ca_file: cannot load CA certificates: {e}") from None
        return ctx


def parse_web_config(data: Any) -> WebConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WebConfigError("(top level): expected a mapping")
    try:
        return validate(WebConfig, data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in loc) or '(top level)'}: {msg}" for loc, msg in e.errors]
        raise WebConfigError("; ".join(lines)) from None


def load_web_config(path: Path) -> WebConfig:
    """Read and validate ``path`` (TLS files are checked for readability, and OpenSSL loads them)."""
    try:
        text = read_text_file(path)
    except InputFileError as e:
        raise WebConfigError(str(e)) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise WebConfigError(yaml_error_message(e)) from None
    config = parse_web_config(data)
    config.ssl_context()  # a cert that does not match its key is a config error, not a start-up crash
    return config
