"""Start-up problems the operator must fix (listen address, state directory), each with its exit code."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from gpuwatchd.config.loader import DEFAULT_STATE_DIR, Config
from gpuwatchd.config.types import fields_set

log = logging.getLogger("gpuwatchd.daemon")


class DaemonError(Exception):
    """A start-up failure the operator must fix; ``exit_code`` is what ``gpuwatchd run`` exits with."""

    exit_code = 6


class ListenError(DaemonError):
    exit_code = 4


class StateDirError(DaemonError):
    exit_code = 5


def resolve_state_dir(config: Config, env: Mapping[str, str]) -> Path:
    """Where the dispatcher keeps its database; created if missing, and proven writable.

    An explicit ``state_dir`` is used as given. Otherwise systemd's ``$STATE_DIRECTORY`` wins, then the default
    ``/var/lib/gpuwatchd`` if we may write there, then ``$XDG_STATE_HOME/gpuwatchd`` so that ``gpuwatchd run``
    as an ordinary user on a fresh machine just works.
    """
    if "state_dir" in fields_set(config):
        return _writable_dir(config.state_dir, "state_dir")
    systemd_dirs = env.get("STATE_DIRECTORY", "")
    if systemd_dirs:
        return _writable_dir(Path(systemd_dirs.split(":")[0]), "$STATE_DIRECTORY")
    try:
        return _writable_dir(DEFAULT_STATE_DIR, "state_dir")
    except StateDirError:
        xdg = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "/tmp")) / ".local" / "state")
        path = Path(xdg) / "gpuwatchd"
        log.info("%s is not writable for this user; keeping state in %s", DEFAULT_STATE_DIR, path)
        return _writable_dir(path, "state_dir")


def _writable_dir(path: Path, key: str) -> Path:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = path / f".gpuwatchd-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise StateDirError(
            f"{key}: cannot write to {path}: {e.strerror or e}. Set state_dir in the config to a writable directory "
            "(under systemd, StateDirectory=gpuwatchd provides one)."
        ) from None
    return path


def listen_error(e: OSError, host: str, port: int) -> ListenError:
    """A bind failure as one line that says what to do."""
    hint = {
        errno.EADDRINUSE: "address already in use (another gpuwatchd or exporter?); choose one with --listen",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
        errno.EADDRNOTAVAIL: "no such local address",
    }.get(e.errno or 0, e.strerror or str(e))
    shown = f"[{host}]" if ":" in host else host
    return ListenError(f"cannot listen on {shown}:{port}: {hint}")
