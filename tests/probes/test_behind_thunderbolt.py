"""``behind_thunderbolt``: sysfs marks the GPU or a bridge above it ``removable``. Read as sysfs is read elsewhere
(one page, non-blocking, regular files only): a FIFO placed in a fake tree blocked the event loop, a byte
outside ASCII raised UnicodeDecodeError out of the probe's verdict."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuwatchd.probes.service import behind_thunderbolt

BUS = "0000:2d:00.0"


def _tree(root: Path, bridge_removable: bytes | None, kind: str = "file") -> None:
    bridge = root / "sys/devices/pci0000:00/0000:00:1c.0"
    gpu = bridge / "0000:2c:00.0/0000:2d:00.0"
    gpu.mkdir(parents=True)
    (gpu / "removable").write_text("fixed\n")
    if kind == "fifo":
        os.mkfifo(bridge / "removable")
    elif bridge_removable is not None:
        (bridge / "removable").write_bytes(bridge_removable)
    link = root / "sys/bus/pci/devices"
    link.mkdir(parents=True)
    (link / BUS).symlink_to(gpu)


def _within(root: Path) -> bool:
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(behind_thunderbolt(root, BUS)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "blocked on the tree"
    return out[0]


@pytest.mark.parametrize(("content", "kind", "want"), [
    (b"removable\n", "file", True),
    (b"fixed\n", "file", False),
    (None, "fifo", False),
    (b"removable\xff\xfe\n", "file", False),
    (b"\xd9\xa1" * 5000, "file", False),
], ids=["removable", "fixed", "fifo", "not-ascii", "page-of-arabic-digits"])
def test_removable_bridge(tmp_path: Path, content: bytes | None, kind: str, want: bool) -> None:
    _tree(tmp_path, content, kind)
    assert _within(tmp_path) is want
