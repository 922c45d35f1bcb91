"""How ``status``, ``probe`` and ``doctor`` reach a daemon that serves TLS and/or basic auth (docs/security.md).

The URL defaults to the config's listen address, ``https://`` when the config's web config file has a
``tls_server_config``; the server certificate is then checked against ``--ca-file``, else the system's trust store
plus the daemon's own ``cert_file`` (a self-signed certificate on the same host needs nothing more). Basic auth:
``--auth-user NAME`` with the password from ``$GPUWATCHD_PASSWORD`` or ``--auth-password-file`` (never on the
command line, where ``ps`` would show it).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PASSWORD_ENV = "GPUWATCHD_PASSWORD"  # noqa: S105 - the variable's name, not a password
AUTH_HINT = (f"the daemon wants basic auth: --auth-user NAME, with the password in ${PASSWORD_ENV} or "
             "--auth-password-file FILE")


# A password file holds one line; a CA bundle (the system's is ~200 KiB) a few hundred certificates.
MAX_PASSWORD_FILE_BYTES = 64 << 10
MAX_CA_FILE_BYTES = 4 << 20


class ClientSetupError(Exception):
    """The client options cannot be used (unreadable CA or password file, a user without a password)."""


@dataclass(frozen=True)
class DaemonClient:
    """TLS trust and basic-auth credentials for talking to the daemon; the defaults are plain HTTP, no auth."""

    ca_files: tuple[Path, ...] = ()  # extra trust anchors (with the system's)
    user: str | None = None
    password: str | None = None

    def session_args(self) -> dict[str, Any]:
        """Keyword arguments for ``aiohttp.ClientSession``: a connector with the trust anchors, the auth."""
        import ssl  # here, not at the top: every CLI start imports this module

        import aiohttp

        out: dict[str, Any] = {}
        if self.ca_files:
            ctx = ssl.create_default_context()
            from gpuwatchd.config.files import InputFileError, read_text_file, shown_path

            for ca in self.ca_files:
                try:
                    # through the capped, non-blocking reader: OpenSSL would block on a FIFO, read /dev/zero forever
                    ctx.load_verify_locations(cadata=read_text_file(ca, max_bytes=MAX_CA_FILE_BYTES))
                except (InputFileError, ssl.SSLError, ValueError) as e:
                    raise ClientSetupError(f"{shown_path(ca)}: cannot be used as a CA file: {e}") from None
            out["connector"] = aiohttp.TCPConnector(ssl=ctx)
        if self.user is not None:
            out["headers"] = {"Authorization": aiohttp.encode_basic_auth(self.user, self.password or "")}
        return out


def add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ca-file", type=Path, metavar="FILE",
                   help="CA certificate to check a TLS daemon's certificate with (default: the system's trust store "
                   "and the daemon's own cert_file from its web config)")
    p.add_argument("--auth-user", metavar="NAME", help="basic-auth user of a daemon with basic_auth_users; the "
                   f"password comes from ${PASSWORD_ENV} or --auth-password-file")
    p.add_argument("--auth-password-file", type=Path, metavar="FILE",
                   help="file holding the basic-auth password (first line)")


def client_from_args(args: argparse.Namespace, web_config_file: Path | None,
                     env: Mapping[str, str] = os.environ) -> DaemonClient:
    """The client options of a command; ``web_config_file`` is the daemon's (its cert_file is trusted too)."""
    cas: list[Path] = [args.ca_file] if args.ca_file is not None else []
    if not cas:
        own = daemon_cert_file(web_config_file)
        if own is not None:
            cas.append(own)
    password: str | None = None
    if args.auth_password_file is not None:
        from gpuwatchd.config.files import InputFileError, read_text_file, shown_path

        try:
            password = read_text_file(args.auth_password_file, max_bytes=MAX_PASSWORD_FILE_BYTES).splitlines()[0]
        except (InputFileError, IndexError) as e:
            raise ClientSetupError(f"--auth-password-file {shown_path(args.auth_password_file)}: cannot read a "
                                   f"password ({e or 'empty file'})") from None
    elif args.auth_user is not None:
        password = env.get(PASSWORD_ENV)
        if password is None:
            raise ClientSetupError(f"--auth-user {args.auth_user}: no password (set ${PASSWORD_ENV} or pass "
                                   "--auth-password-file)")
    return DaemonClient(ca_files=tuple(cas), user=args.auth_user, password=password)


def daemon_cert_file(web_config_file: Path | None) -> Path | None:
    """The daemon's own certificate when its web config serves TLS (None when unset or unreadable)."""
    tls = _tls(web_config_file)
    cert = tls.get("cert_file") if tls is not None else None
    return Path(cert) if isinstance(cert, str) and cert else None


def serves_tls(web_config_file: Path | None) -> bool:
    return _tls(web_config_file) is not None


def _tls(web_config_file: Path | None) -> dict[str, Any] | None:
    """The web config's ``tls_server_config`` as written. Only read, not validated: the key file is often readable
    by the daemon's user alone, and the client needs to know "TLS or not" and the certificate, nothing more."""
    if web_config_file is None:
        return None
    import yaml

    from gpuwatchd.config.files import InputFileError, read_text_file
    from gpuwatchd.config.safe_yaml import load_yaml

    try:
        data = load_yaml(read_text_file(web_config_file))
    except (InputFileError, yaml.YAMLError):
        return None  # unreadable here: the URL stays as given (pass --url https://... and --ca-file)
    tls = data.get("tls_server_config") if isinstance(data, dict) else None
    return tls if isinstance(tls, dict) else None


def client_for(args: argparse.Namespace, config_path: Path | None) -> DaemonClient:
    """:func:`client_from_args` with the web config file of the config at ``config_path`` (defaults if unusable)."""
    from gpuwatchd.config.loader import ConfigError, load_config

    try:
        web = load_config(config_path).web_config_file
    except ConfigError:
        web = None
    return client_from_args(args, web)


def tls_problem(url: str, e: BaseException) -> str | None:
    """A TLS failure talking to ``url`` as one line saying what to do; None when ``e`` is not about TLS (nothing
    listens, a timeout). Something that answers with a TLS failure is a daemon: ``probe`` must not run beside it."""
    import ssl

    import aiohttp

    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        why = getattr(e.certificate_error, "verify_message", None) or str(e.certificate_error)
        return (f"TLS: certificate verify failed ({why}): the daemon's certificate is not trusted; pass the CA that "
                "signed it with --ca-file")
    if isinstance(e, aiohttp.ClientSSLError | ssl.SSLError):
        text = str(e)
        if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
            return "TLS handshake failed: the daemon does not serve TLS at this address; use an http:// URL"
        return f"TLS handshake failed: {text}"
    if isinstance(e, aiohttp.ServerDisconnectedError) and url.startswith("http://"):
        return ("the server closed the connection without an answer, as a daemon serving TLS does to plain HTTP; "
                "use an https:// URL")
    return None


def default_status_url(config_path: Path | None) -> str:
    """The URL `status` talks to: the config's listen address, loopback when it listens on all interfaces."""
    from gpuwatchd.config.loader import Config, ConfigError, load_config, parse_listen

    try:
        cfg = load_config(config_path)
    except ConfigError:
        cfg = Config()
    host, port = parse_listen(cfg.listen)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    scheme = "https" if serves_tls(cfg.web_config_file) else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
