"""Thunderbolt/USB4 docks and eGPU enclosures from ``<sysfs.root>/sys/bus/thunderbolt/devices``, with their GPUs.

What NVML cannot say about an eGPU: that a dock is attached but not authorized (so the GPU behind it never
appears), and how its link trained. Read from sysfs under the injectable root, like ``pcie`` (the kernel's
Documentation/ABI/testing/sysfs-bus-thunderbolt).

Tying a dock to its GPU goes through the PCI topology, since the kernel exports no link between a Thunderbolt
device and the PCI functions of its tunnel:

1. The GPU is Thunderbolt-attached when it or a PCI ancestor in its sysfs device path is ``removable`` (the kernel
   marks everything below an external-facing port, Linux 5.14+). An internal GPU never is.
2. Its domain is the one whose host controller (the PCI parent of ``domainN``) shares the longest PCI path with
   the GPU: the tunnel's downstream ports sit next to the controller's NHI, under the same root port or switch.
3. In that domain, the dock is the one authorized device (PCIe tunnels exist only to authorized devices). With
   several authorized devices in one domain (a daisy chain) the topology does not say which one holds the GPU,
   and the dock is left untied rather than guessed (``gpu_uuid`` is then empty on the info series).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatchd.model import DockSample
from gpuwatchd.runtime.beat import Beat, next_turn
from gpuwatchd.sources.sysfs.pcie import (
    GONE_ERRNOS,
    PCI_DEVICES,
    PciScanCache,
    SysfsUnreadable,
    nvidia_devices,
    read_attr,
)
from gpuwatchd.textint import ascii_uint

if TYPE_CHECKING:
    from gpuwatchd.config.loader import Config
    from gpuwatchd.runtime.clock import Clock

log = logging.getLogger(__name__)

# Floor of the scan period in real seconds, as for the PCI hot-plug scan (sim --speed shrinks the poll interval).
WATCH_MIN_SECONDS = 0.25

TB_DEVICES = Path("sys/bus/thunderbolt/devices")
_TB_DEVICES = str(TB_DEVICES)
_PCI_DEVICES = str(PCI_DEVICES)
_ROUTER = re.compile(r"^(\d+)-([0-9a-f]+)$")
_DOMAIN = re.compile(r"^domain(\d+)$")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PCI_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
# ASCII digits, bounded: ``\d`` also matches Unicode digits, and a page of digits read as a float is +Inf.
_SPEED = re.compile(r"^\s*([0-9]{1,4}(?:\.[0-9]{1,3})?)\s*Gb/s\s*$")


def parse_speed(text: str | None) -> float | None:
    """``"20.0 Gb/s"`` (per lane, the kernel's format) -> 2e10 bits/s; anything else -> None."""
    m = _SPEED.match(text or "")
    return float(m.group(1)) * 1e9 if m else None


def _int(text: str | None) -> int | None:
    # the kernel prints these (generation, lanes) with %u: a few ASCII digits; anything else is garbage
    return ascii_uint(text, 4) if text else None


def domain_security(root: Path) -> dict[str, str | None]:
    """``domainN`` -> its security level (``none``, ``user``, ``secure``, ``dponly``, ``usbonly``)."""
    base = root / TB_DEVICES
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    return {n: read_attr(base / n / "security") for n in sorted(names) if _DOMAIN.match(n)}


class ResolvedLinks:
    """``os.path.realpath`` of the sysfs entries the Thunderbolt watch reads every second (each GPU's and domain's
    link in ``sys/bus/*/devices``), kept while the entry's own link target reads the same.

    ``realpath`` of a sysfs device walks every component of a path ten or more deep with an ``lstat`` each: ~57 a
    read of one dock with one GPU, most of the watch's 2.0-2.6 ms a second on an eGPU laptop (docs/performance.md,
    "8x32"). The kernel links a device's bus entry to its directory when the device is added and removes both
    together, so one ``readlink`` tells whether the entry is the one resolved before; an entry that is not a link
    (or is gone) is resolved as before, every time.
    """

    __slots__ = ("_known",)
    MAX_ENTRIES = 1024  # GPUs and domains under one root; a root changed by reloads starts afresh past this

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, str]] = {}  # entry -> (its link target, its realpath)

    def realpath(self, path: str | Path) -> str:
        entry = os.fspath(path)
        try:
            target = os.readlink(entry)
        except OSError:
            return os.path.realpath(entry)
        known = self._known.get(entry)
        if known is not None and known[0] == target:
            return known[1]
        real = os.path.realpath(entry)
        if len(self._known) >= self.MAX_ENTRIES:
            self._known.clear()
        self._known[entry] = (target, real)
        return real


def _pci_path(path: str | Path, resolve: Callable[[str | Path], str] = os.path.realpath) -> list[str]:
    """The PCI components (bus ids and ``pciDDDD:BB`` roots) of a sysfs device path, after resolving links."""
    return [p for p in resolve(path).split(os.sep) if _BDF.match(p) or _PCI_ROOT.match(p)]


def _tunnelled(gpu_dir: str | Path, resolve: Callable[[str | Path], str] = os.path.realpath) -> bool:
    """Whether the GPU or a PCI ancestor is ``removable`` (below an external-facing port)."""
    d = resolve(gpu_dir)
    while _BDF.match(os.path.basename(d)):
        if read_attr(d + "/removable") == "removable":
            return True
        d = os.path.dirname(d)
    return False


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _gpu_domain(root: Path, gpu_path: list[str], domains: Iterable[str],
                resolve: Callable[[str | Path], str] = os.path.realpath) -> str | None:
    best, best_len = None, 0
    base = os.path.join(root, _TB_DEVICES)
    for d in domains:
        shared = _common(_pci_path(os.path.join(base, d), resolve), gpu_path)
        if shared > best_len:
            best, best_len = d, shared
    return best


def read_docks(root: Path, gpu_bus_ids: Iterable[str] | None = None, *, strict: bool = False,
               pci_cache: PciScanCache | None = None, links: ResolvedLinks | None = None) -> tuple[DockSample, ...]:
    """Every attached Thunderbolt/USB4 device but the host routers, with the GPUs behind each.

    ``gpu_bus_ids`` (sysfs form) defaults to the NVIDIA display functions present under ``root``. ``strict`` (the
    daemon's watch): a directory that exists but cannot be read raises SysfsUnreadable instead of reading as "no
    devices", which would detach every dock. ``pci_cache`` and ``links``: what the watch keeps between its reads
    (:class:`PciScanCache`, :class:`ResolvedLinks`); the result is the same without them.
    """
    resolve = links.realpath if links is not None else os.path.realpath
    base = os.path.join(root, _TB_DEVICES)  # strings, not Path objects: ~12 files a router a second
    try:
        names = sorted(os.listdir(base))
    except OSError as e:  # no Thunderbolt bus (most hosts, every second): nothing more to read
        if e.errno in GONE_ERRNOS or not strict:
            return ()
        raise SysfsUnreadable(e.errno, f"cannot read {base}: {e.strerror or e}") from None
    security = domain_security(root)
    routers: list[tuple[str, str, str]] = []
    for n in names:
        m = _ROUTER.match(n)
        if m and int(m.group(2), 16) != 0:  # route 0 is the host router itself
            routers.append((n, f"domain{m.group(1)}", os.path.join(base, n, "")))
    if not routers:
        return ()
    authorized = {n: read_attr(d + "authorized") == "1" for n, _, d in routers}
    behind: dict[str, list[str]] = {}
    try:
        gpus = sorted(nvidia_devices(root, pci_cache) if gpu_bus_ids is None else gpu_bus_ids)
    except SysfsUnreadable:
        if strict:
            raise
        gpus = []
    pci_base = os.path.join(root, _PCI_DEVICES)
    for bdf in gpus:
        gpu_entry = os.path.join(pci_base, bdf)
        path = _pci_path(gpu_entry, resolve)
        if not path or not _tunnelled(gpu_entry, resolve):
            continue
        domain = _gpu_domain(root, path, security, resolve)
        candidates = [n for n, dom, _ in routers if dom == domain and authorized[n]]
        if len(candidates) == 1:
            behind.setdefault(candidates[0], []).append(bdf)
    out: list[DockSample] = []
    for n, dom, d in routers:
        auth = read_attr(d + "authorized")
        out.append(
            DockSample(
                unique_id=read_attr(d + "unique_id") or n,
                route=n,
                domain=dom,
                security=security.get(dom),
                authorized=None if auth is None else auth == "1",
                vendor=read_attr(d + "vendor_name"),
                name=read_attr(d + "device_name"),
                generation=_int(read_attr(d + "generation")),
                rx_speed_bps=parse_speed(read_attr(d + "rx_speed")),
                tx_speed_bps=parse_speed(read_attr(d + "tx_speed")),
                rx_lanes=_int(read_attr(d + "rx_lanes")),
                tx_lanes=_int(read_attr(d + "tx_lanes")),
                gpu_bus_ids=tuple(behind.get(n, ())),
            )
        )
    return tuple(out)


async def watch_docks(
    config: Callable[[], Config], clock: Clock, on_docks: Callable[[tuple[DockSample, ...]], object],
    beat: Beat | None = None,
) -> None:
    """Read the docks every poll interval (``sysfs.root`` and the interval follow config reloads) until cancelled.

    Polled like the PCI tree's hot-plug scan: authorization and link training change without a PCI event, and a
    handful of small sysfs reads per interval costs nothing. With a ``beat`` (the NVML supervisor's, fired after
    each worker line) the reads run on it, in that line's wake-up, and on their own 1.1 intervals after the last
    read when no line comes (``runtime/beat.next_turn``): the watch's own wake-up cost more than its reads.
    """
    unreadable = False
    pci_cache = PciScanCache()
    links = ResolvedLinks()
    loop = asyncio.get_running_loop()
    while True:
        last = loop.time()
        cfg = config()
        try:
            on_docks(read_docks(cfg.sysfs.root, strict=True, pci_cache=pci_cache, links=links))
            unreadable = False
        except SysfsUnreadable as e:  # unknown, not detached: keep the docks last read (one line until it recovers)
            if not unreadable:
                log.warning("thunderbolt watch: %s; docks unknown until it can be read again", e.strerror)
            unreadable = True
        except Exception:  # a reader bug must not end the watch (the daemon stops when a core task dies)
            log.exception("reading Thunderbolt devices under %s failed", cfg.sysfs.root)
        await next_turn(beat, config().nvml.poll_interval / clock.speed, WATCH_MIN_SECONDS, last)
