"""The client's message: one JSON object per line on a unix stream socket, versioned by ``"v"``.

Schema 1 (docs/training.md)::

    {"v": 1, "pid": 4242, "t": 1700000000.0,
     "devices": [{"index": 0, "uuid": "GPU-...", "allocated_bytes": ..., "reserved_bytes": ..., "active_bytes": ...,
                  "inactive_split_bytes": ..., "alloc_retries": ..., "ooms": ..., "device_allocs": ...,
                  "device_frees": ..., "free_bytes": ..., "total_bytes": ...}],
     "input_wait_ratio": 0.42,                       # only when the data loader is wrapped
     "oom": {"device": 0, "requested_bytes": ..., "device_allocated_bytes": ..., "device_free_bytes": ...}}

Every field but ``v`` and ``devices`` may be absent; a reader ignores fields it does not know. The daemon reads at
most ``MAX_MESSAGE_BYTES`` per line. Standard library only: the client must not import the daemon's packages.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA_VERSION = 1
# A line longer than this is refused by the daemon (sources/training/): 16 devices' entries take ~5 KB.
MAX_MESSAGE_BYTES = 64 * 1024
SOCKET_NAME = "training.sock"
# Where the daemon listens by default: systemd's RuntimeDirectory=gpuwatchd, then the user's runtime directory.
DEFAULT_SOCKET_DIRS = ("/run/gpuwatchd",)
SOCKET_ENV = "GPUWATCHD_TRAINING_SOCKET"


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line (compact JSON, newline-terminated)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
