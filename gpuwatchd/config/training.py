"""The ``training`` config section: the socket training processes report PyTorch's allocator on (docs/training.md)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpuwatchd.config.types import PositiveDuration, SafePath, Section


class TrainingConfig(Section, frozen=True):
    """The local socket `gpuwatchd.training` clients send allocator counters to (applied at start; a reload that
    changes it says a restart is needed)."""

    # Listen at all. Off: no socket; the per-process torch metrics are absent and everything else is unchanged.
    enabled: bool = True
    # The socket's path. Unset: training.sock in the runtime directory ($RUNTIME_DIRECTORY under systemd, else
    # /run/gpuwatchd if writable, else $XDG_RUNTIME_DIR/gpuwatchd). Mount its directory into a container for the
    # jobs inside to report.
    socket: SafePath | None = None
    # Connections open at once; more are refused (each training process holds one).
    max_peers: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 256
    # The longest line a client may send; a longer one closes its connection.
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 20)] = 64 * 1024
    # Lines from one connection closer together than this are dropped (the client sends every 10 s, and at once
    # on an out-of-memory error).
    min_interval: PositiveDuration = 1.0
    # A connection that sends nothing for this long is closed (the client reconnects on its next report).
    idle_timeout: PositiveDuration = 600.0
