"""PCIe link state and NVIDIA device presence from sysfs, under an injectable root (node_exporter ``--path.sysfs``).

Independent of NVML on purpose: a hung or lost driver still leaves these files readable, and a device directory
that vanishes is how a Thunderbolt detach or a ``remove`` shows up.

Only "no such file" means gone. Any other failure to read (EMFILE when descriptors run out, EACCES, EIO) raises
:class:`SysfsUnreadable`: the state is unknown this time, and callers keep what they knew. Taking a failed read for
an empty directory made a descriptor flood look like every GPU being removed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from gpuwatchd.gpu.bus_id import sysfs_bus_id
from gpuwatchd.model import LinkSample

PCI_DEVICES = Path("sys/bus/pci/devices")
_PCI_DEVICES = str(PCI_DEVICES)
NVIDIA_VENDOR = "0x10de"
# PCI base class 0x03 = display controller (VGA 0x0300, 3D 0x0302): the GPU functions, not the HDMI audio one.
DISPLAY_CLASS_PREFIX = "0x03"
# PCIe transfer rate (GT/s) -> generation; same mapping as NVML CurrPcieLinkGeneration.
GENERATION_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# A device whose config space reads all-ones (fell off the bus) reports width 63 and vendor 0xffff
# (the 6-bit Negotiated Link Width field of the PCIe Link Status register reads 0x3f).
DEAD_LINK_WIDTH = 63
DEAD_VENDOR = "0xffff"
_DEAD_WIDTH_TEXT = str(DEAD_LINK_WIDTH)
# The widest link the PCIe spec defines (x32); anything wider is garbage, like the dead link's 63.
MAX_LINK_WIDTH = 32
# A sysfs attribute is at most one page (the kernel's show() buffer is PAGE_SIZE).
ATTR_MAX_BYTES = 4096


# errno values that mean "not there" (a device removed between listing and reading it); anything else is unknown.
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.ENXIO})


class SysfsUnreadable(OSError):
    """sysfs could not be read (not: the device is gone). The state is unknown; keep the last one."""


def _unreadable(path: str | Path, e: OSError) -> SysfsUnreadable:
    return SysfsUnreadable(e.errno, f"cannot read {path}: {e.strerror or e}")


def _read_small(path: str | Path) -> str:
    """One sysfs attribute: a regular file of at most a page, read once, never blocking.

    The kernel serves an attribute in one read of at most PAGE_SIZE. Anything else under the root (a FIFO or a
    device placed in a fake or hostile tree, a huge file) is refused or cut here rather than hanging the poll or
    filling memory: ``Path.read_text`` would block on a FIFO and read a file of any size.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (sysfs attributes are)")
        data = os.read(fd, ATTR_MAX_BYTES)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


def read_attr(path: str | Path) -> str | None:
    """A sysfs attribute's text, stripped; None when it cannot be read (gone, no permission, not a file)."""
    try:
        return _read_small(path)
    except OSError:
        return None


def read_attr_or_gone(path: str | Path) -> str | None:
    """A sysfs attribute's text, stripped; None when it is gone; :class:`SysfsUnreadable` for any other failure."""
    try:
        return _read_small(path)
    except OSError as e:
        if e.errno in GONE_ERRNOS:
            return None
        raise _unreadable(path, e) from None


def parse_speed(text: str | None) -> int | None:
    """``"8.0 GT/s PCIe"`` (or older ``"8 GT/s"``) -> 3; ``"Unknown"`` or garbage -> None."""
    if not text:
        return None
    head = text.split(None, 1)[0]
    try:
        gts = float(head)
    except ValueError:
        return None
    return GENERATION_BY_GTS.get(gts)


def parse_width(text: str | None) -> int | None:
    """``"16"`` -> 16; the all-ones value 63, 0, widths beyond the spec's x32 and garbage -> None."""
    if not text or len(text) > 4 or not text.isascii():  # int() also reads Arabic-Indic digits
        return None
    try:
        width = int(text, 0) if text.startswith("0x") else int(text)
    except ValueError:
        return None
    if not 0 < width <= MAX_LINK_WIDTH:
        return None
    return width


def read_link(root: str | Path, bus_id: str) -> LinkSample:
    """One device's link; ``present=False`` when the directory is gone or the device reads as dead.

    Paths are plain strings: the hot-plug watch reads every GPU's link each poll interval, and building ``Path``
    objects for its six file names was ~40 % of that (1.07 -> 0.62 ms a scan of 8 GPUs, polls a second apart;
    docs/performance.md, "8x32").
    """
    bdf = sysfs_bus_id(bus_id)
    d = os.path.join(root, _PCI_DEVICES, bdf)
    try:
        os.stat(d)
    except OSError as e:
        if e.errno in GONE_ERRNOS:
            return LinkSample(pci_bus_id=bdf, present=False)
        raise _unreadable(d, e) from None
    vendor = read_attr_or_gone(d + "/vendor")
    cur_speed = read_attr(d + "/current_link_speed")
    cur_width_raw = read_attr(d + "/current_link_width")
    dead = vendor == DEAD_VENDOR or (cur_speed or "").lower() == "unknown" or cur_width_raw == _DEAD_WIDTH_TEXT
    return LinkSample(
        pci_bus_id=bdf,
        current_generation=parse_speed(cur_speed),
        max_generation=parse_speed(read_attr(d + "/max_link_speed")),
        current_width=parse_width(cur_width_raw),
        max_width=parse_width(read_attr(d + "/max_link_width")),
        present=not dead,
    )


def read_links(root: str | Path, bus_ids: Iterable[str]) -> list[LinkSample]:
    """PCIe link of each device (NVML or sysfs bus id form), in the order given; SysfsUnreadable when unknown."""
    return [read_link(root, b) for b in bus_ids]


class PciScanCache:
    """The PCI functions a scan found not to be NVIDIA display functions, by name and directory-entry inode.

    A host's PCI functions rarely change and most are not NVIDIA GPUs (bridges, NICs, NVMe, USB: hundreds on a
    large server), yet the watch scans every second. A function the cache knows costs nothing beyond the directory
    listing: its ``vendor`` and ``class`` are not read again while its entry stays the same. The entry's inode comes
    with the listing (``os.scandir``, no ``stat``); sysfs gives a re-added device a new inode (kernfs numbers nodes
    cyclically), so a function removed and added back at the same address, even between two scans, is read afresh.
    NVIDIA functions, and any whose vendor or class could not be read or read as dead (``0xffff``), are read at
    every scan, as without the cache: a GPU's appearance, removal or fall off the bus is seen exactly as before.
    """

    __slots__ = ("root", "skip")

    def __init__(self) -> None:
        self.root: Path | None = None
        self.skip: dict[str, int] = {}  # name -> inode of its entry when it was found not to be an NVIDIA GPU


def nvidia_devices(root: Path, cache: PciScanCache | None = None) -> set[str]:
    """Bus ids (sysfs form) of NVIDIA display-class functions present under ``root``: the hot-plug watch set.

    With ``cache`` (kept by a watch between its scans), functions an earlier scan found not to be NVIDIA GPUs are
    not read again (:class:`PciScanCache`); the result is the same.
    """
    base = root / PCI_DEVICES
    if cache is not None and cache.root != root:
        cache.root, cache.skip = root, {}
    known = cache.skip if cache is not None else {}
    skip: dict[str, int] = {}
    found: set[str] = set()
    try:
        with os.scandir(base) as entries:
            for entry in entries:
                name, ino = entry.name, entry.inode()
                if known.get(name) == ino:
                    skip[name] = ino
                    continue
                d = entry.path  # a string: no Path objects per function and file (read_link)
                vendor = read_attr_or_gone(d + "/vendor")
                if vendor != NVIDIA_VENDOR:
                    if vendor is not None and vendor != DEAD_VENDOR:
                        skip[name] = ino
                    continue
                cls = read_attr(d + "/class")
                if cls is not None and cls.lower().startswith(DISPLAY_CLASS_PREFIX):
                    found.add(name.lower())
                elif cls is not None and cls.lower() != "0xffffff":  # NVIDIA, not a GPU: its HDMI audio function
                    skip[name] = ino
    except SysfsUnreadable:
        raise
    except OSError as e:
        if e.errno in GONE_ERRNOS:
            return set()  # no sysfs PCI tree at all (a container, a test root): nothing to watch
        raise _unreadable(base, e) from None
    if cache is not None:
        cache.skip = skip
    return found
