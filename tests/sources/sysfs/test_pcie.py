"""sysfs PCIe link parsing and the NVIDIA device watch set, against hand-made sysfs trees."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
from pathlib import Path

import pytest

from gpuwatchd.model import LinkSample
from gpuwatchd.sources.nvml.hotplug import SysfsWatch
from gpuwatchd.sources.sysfs import pcie as sysfs_pcie
from gpuwatchd.sources.sysfs.pcie import (
    SysfsUnreadable,
    nvidia_devices,
    parse_speed,
    parse_width,
    read_links,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


def test_nvidia_devices_lists_display_functions_only() -> None:
    # the HDMI audio function (class 0x0403) and the Intel bridge are not GPUs
    assert nvidia_devices(FIXTURES / "two-gpus") == {"0000:0c:00.0", "0000:05:00.0"}
    assert nvidia_devices(FIXTURES / "one-gpu") == {"0000:0c:00.0"}


def test_nvidia_devices_missing_root_is_empty(tmp_path: Path) -> None:
    assert nvidia_devices(tmp_path / "nope") == set()


def test_read_links_takes_nvml_bus_ids_and_reports_degraded_link() -> None:
    links = read_links(FIXTURES / "two-gpus", ["00000000:0C:00.0", "0000:05:00.0"])
    assert links == [
        LinkSample("0000:0c:00.0", current_generation=1, max_generation=4, current_width=8, max_width=16),
        LinkSample("0000:05:00.0", current_generation=3, max_generation=4, current_width=4, max_width=16),
    ]


def test_unplugged_device_is_not_present() -> None:
    [link] = read_links(FIXTURES / "one-gpu", ["00000000:05:00.0"])
    assert link == LinkSample("0000:05:00.0", present=False)


def test_dead_link_reads_as_not_present_without_bogus_values() -> None:
    [link] = read_links(FIXTURES / "dead-link", ["0000:05:00.0"])
    assert link.present is False
    assert (link.current_generation, link.current_width, link.max_width) == (None, None, None)


def test_old_kernel_speed_format() -> None:
    [link] = read_links(FIXTURES / "old-kernel", ["0000:0c:00.0"])
    assert (link.current_generation, link.current_width, link.present) == (3, 16, True)


@pytest.mark.parametrize(
    ("text", "gen"),
    [("2.5 GT/s PCIe", 1), ("5.0 GT/s PCIe", 2), ("16.0 GT/s PCIe", 4), ("32.0 GT/s PCIe", 5), ("64.0 GT/s PCIe", 6),
     ("8 GT/s", 3), ("Unknown", None), ("", None), (None, None), ("7.5 GT/s", None)],
)
def test_parse_speed(text: str | None, gen: int | None) -> None:
    assert parse_speed(text) == gen


@pytest.mark.parametrize(
    ("text", "width"),
    [("16", 16), ("1", 1), ("32", 32), ("63", None), ("0", None), ("33", None), ("-4", None), ("x", None),
     (None, None), ("1" * 4096, None), ("\u0661\u0666", None)],
)
def test_parse_width(text: str | None, width: int | None) -> None:
    assert parse_width(text) == width


def _emfile(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.EMFILE, "Too many open files")


def test_a_failed_read_is_unknown_not_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE (a connection flood used every descriptor) is not an empty PCI tree: the watch keeps what it knew."""
    root = FIXTURES / "two-gpus"
    changes: list[str] = []
    links: list[list[LinkSample]] = []
    watch = SysfsWatch(lambda: root, lambda: 0.0, changes.append, links.append)
    watch.baseline()
    watch.bus_ids = ["0000:0c:00.0"]
    monkeypatch.setattr(sysfs_pcie.os, "scandir", _emfile)
    with pytest.raises(SysfsUnreadable):
        nvidia_devices(root)
    monkeypatch.setattr(sysfs_pcie.os, "stat", _emfile)
    with pytest.raises(SysfsUnreadable):
        read_links(root, ["0000:0c:00.0"])

    async def a_few_scans() -> None:
        task = asyncio.ensure_future(watch.run())
        for _ in range(200):
            if watch.unreadable >= 3:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(a_few_scans())
    assert watch.unreadable >= 3
    assert changes == [] and links == []  # no "removed", no dead links
    assert watch.seen == {"0000:0c:00.0", "0000:05:00.0"}


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "two-gpus", root, symlinks=True)
    return root, root / "sys/devices/pci0000:00/0000:00:01.0/0000:05:00.0"


def test_a_fifo_in_place_of_an_attribute_does_not_hang_the_poll(tmp_path: Path) -> None:
    root, dev = _tree(tmp_path)
    (dev / "current_link_speed").unlink()
    os.mkfifo(dev / "current_link_speed")  # nobody ever writes it: a blocking read would wait forever
    [link] = read_links(root, ["0000:05:00.0"])
    assert link.present and link.current_generation is None and link.current_width == 4
    (dev / "vendor").unlink()
    os.mkfifo(dev / "vendor")  # not "gone": unknown, and the watch keeps what it knew
    with pytest.raises(SysfsUnreadable, match="not a regular file"):
        read_links(root, ["0000:05:00.0"])


def test_a_huge_attribute_is_read_to_one_page_only(tmp_path: Path) -> None:
    root, dev = _tree(tmp_path)
    with (dev / "current_link_width").open("wb") as f:
        f.write(b"4" + b" " * (64 * 1024 * 1024))  # 64 MiB: sysfs never serves more than a page
    assert sysfs_pcie.read_attr(dev / "current_link_width") == "4"
    big = dev / "max_link_width"
    big.write_bytes(b"1" * (10 * 1024 * 1024))
    text = sysfs_pcie.read_attr(big)
    assert text is not None and len(text) == sysfs_pcie.ATTR_MAX_BYTES
    [link] = read_links(root, ["0000:05:00.0"])
    assert link.current_width == 4 and link.max_width is None  # a page of digits is no width


def _add_function(root: Path, bdf: str, vendor: str, cls: str) -> None:
    """A PCI function as the kernel lays it out: its directory under sys/devices, a symlink in sys/bus/pci/devices.

    The symlink is made under a temporary name and renamed into place, so an entry replaced at the same address
    gets a new inode, as sysfs gives a re-added device (a local filesystem could hand an unlinked inode back).
    """
    d = root / "sys/devices/pci0000:00" / bdf
    d.mkdir(parents=True, exist_ok=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")
    links = root / sysfs_pcie.PCI_DEVICES
    links.mkdir(parents=True, exist_ok=True)
    (links / f".{bdf}.new").symlink_to(f"../../../devices/pci0000:00/{bdf}")
    os.replace(links / f".{bdf}.new", links / bdf)


def test_a_steady_host_costs_one_listing_a_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 functions that are not GPUs (bridges, NICs, NVMe, an NVIDIA audio function) are read once; the GPUs at
    every scan, and a GPU added, removed, or put at an address a non-GPU had is seen at the next scan."""
    root = tmp_path / "root"
    for i in range(299):
        _add_function(root, f"0000:{i // 32 + 1:02x}:{i % 32:02x}.0", "0x8086", "0x060400")
    _add_function(root, "0000:41:00.1", "0x10de", "0x040300")  # a GPU's HDMI audio function
    _add_function(root, "0000:41:00.0", "0x10de", "0x030000")
    _add_function(root, "0000:42:00.0", "0x10de", "0x030200")
    reads: list[str] = []
    real_read = sysfs_pcie._read_small

    def counted(path: str | Path) -> str:
        p = Path(path)  # the scan reads through plain string paths
        reads.append(f"{p.parent.name}/{p.name}")
        return real_read(path)

    monkeypatch.setattr(sysfs_pcie, "_read_small", counted)
    cache = sysfs_pcie.PciScanCache()
    gpus = {"0000:41:00.0", "0000:42:00.0"}
    assert nvidia_devices(root, cache) == gpus
    assert len(reads) == 302 + 3  # every vendor, and the class of the three NVIDIA functions
    for _ in range(3):
        reads.clear()
        assert nvidia_devices(root, cache) == gpus
        assert sorted(reads) == ["0000:41:00.0/class", "0000:41:00.0/vendor", "0000:42:00.0/class",
                                 "0000:42:00.0/vendor"]
    # the same answers as a scan without a cache, through every change
    (root / sysfs_pcie.PCI_DEVICES / "0000:42:00.0").unlink()  # detached
    assert nvidia_devices(root, cache) == nvidia_devices(root) == {"0000:41:00.0"}
    _add_function(root, "0000:71:00.0", "0x10de", "0x030000")  # docked
    assert nvidia_devices(root, cache) == nvidia_devices(root) == {"0000:41:00.0", "0000:71:00.0"}
    shutil.rmtree(root / "sys/devices/pci0000:00/0000:01:05.0")
    _add_function(root, "0000:01:05.0", "0x10de", "0x030000")  # a GPU where a bridge was
    reads.clear()
    assert nvidia_devices(root, cache) == {"0000:41:00.0", "0000:71:00.0", "0000:01:05.0"}
    assert "0000:01:05.0/vendor" in reads and len(reads) == 6
    (root / "sys/devices/pci0000:00/0000:41:00.0/vendor").write_text("0xffff\n")  # fell off the bus
    assert nvidia_devices(root, cache) == nvidia_devices(root) == {"0000:71:00.0", "0000:01:05.0"}
    (root / "sys/devices/pci0000:00/0000:41:00.0/vendor").write_text("0x10de\n")
    assert nvidia_devices(root, cache) == {"0000:41:00.0", "0000:71:00.0", "0000:01:05.0"}
    # another root (a config reload) starts afresh
    assert nvidia_devices(FIXTURES / "two-gpus", cache) == {"0000:0c:00.0", "0000:05:00.0"}
    assert cache.root == FIXTURES / "two-gpus"
