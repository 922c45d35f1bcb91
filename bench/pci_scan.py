"""CPU of the hot-plug watch's PCI scan (``sysfs/pcie.nvidia_devices``) and link reads, on a host with many PCI
functions.

    python bench/pci_scan.py [--devices 300] [--gpus 8] [--scans 200] [--rounds 2] [--apart 0] [--tree OTHER_CHECKOUT]

A synthetic ``sys/bus/pci/devices`` tree laid out as the kernel's (directories under ``sys/devices``, symlinks in
the bus directory) with ``--devices`` functions that are not GPUs (bridges, NICs, NVMe: what a large server lists;
the bench's daemon has no PCI tree at all, so ``footprint.py`` never shows this) and ``--gpus`` NVIDIA GPUs, each
with its HDMI audio function. Then ``--scans`` scans, as the watch makes one a second, each timed with
``time.thread_time`` (CPU of this thread), the cache kept between them when the tree has one (``PciScanCache``);
also the ``open`` calls of a steady scan; then each scan's link reads of the GPUs (``read_links``, what the watch
reads after each scan: ``links_us``). ``--apart S`` sleeps S seconds between scans, as the watch does (one a
second: the code and data a scan touches are then out of the CPU's caches, and cost several times more; use a few
dozen ``--scans``). Each tree runs in its own child process; with ``--tree`` the other
checkout runs too, the two alternated ``--rounds`` times. The last line holds the figures as name=value pairs
(the median scan in microseconds, best round of each; ``old_`` for ``--tree``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


LINK = (("current_link_speed", "16.0 GT/s PCIe"), ("current_link_width", "16"), ("max_link_speed", "16.0 GT/s PCIe"),
        ("max_link_width", "16"))


def build(root: Path, devices: int, gpus: int) -> None:
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True)

    def add(bdf: str, vendor: str, cls: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        d = root / "sys/devices/pci0000:00" / bdf
        d.mkdir(parents=True)
        for name, text in (("vendor", vendor), ("class", cls), ("device", "0x1234"), *extra):
            (d / name).write_text(text + "\n")
        (links / bdf).symlink_to(f"../../../devices/pci0000:00/{bdf}")

    for i in range(devices):
        add(f"0000:{i // 32:02x}:{i % 32:02x}.{i % 8}", ("0x8086", "0x15b3", "0x144d")[i % 3], "0x060400")
    for g in range(gpus):
        add(f"0000:{0x80 + g:02x}:00.0", "0x10de", "0x030200", LINK)
        add(f"0000:{0x80 + g:02x}:00.1", "0x10de", "0x040300")


def child(devices: int, gpus: int, scans: int, apart: float = 0.0) -> dict[str, float]:
    from gpuwatchd.sources.sysfs import pcie

    cache_type = getattr(pcie, "PciScanCache", None)
    cache = cache_type() if cache_type is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, devices, gpus)

        def scan() -> set[str]:
            return pcie.nvidia_devices(root, cache) if cache is not None else pcie.nvidia_devices(root)

        gpu_ids = sorted(scan())
        assert len(gpu_ids) == gpus
        times = []
        link_times = []
        for _ in range(scans):
            if apart:
                time.sleep(apart)
            t0 = time.thread_time()
            scan()
            t1 = time.thread_time()
            links = pcie.read_links(root, gpu_ids)
            link_times.append(time.thread_time() - t1)
            times.append(t1 - t0)
        assert all(link.current_width == 16 and link.present for link in links)
        opens = 0
        real_open = os.open

        def counting_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
            nonlocal opens
            opens += 1
            return real_open(path, flags, mode)

        setattr(os, "open", counting_open)  # noqa: B010 (the module the reader calls os.open through)
        scan()
        setattr(os, "open", real_open)  # noqa: B010
    return {"scan_us": statistics.median(times) * 1e6, "opens": float(opens),
            "links_us": statistics.median(link_times) * 1e6}


def run(tree: Path, devices: int, gpus: int, scans: int, apart: float) -> dict[str, float]:
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'bench')!r});"
            f" import pci_scan; print(json.dumps(pci_scan.child({devices}, {gpus}, {scans}, {apart})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=300)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scans", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--apart", type=float, default=0.0, help="seconds between scans (the watch: one a second)")
    ap.add_argument("--tree", type=Path, help="another checkout, measured alternately")
    a = ap.parse_args()
    alternate(a.tree, a.rounds, lambda tree: run(tree, a.devices, a.gpus, a.scans, a.apart),
              lambda res: (f"scan {res['scan_us']:.0f} us, {res['opens']:.0f} opens a steady scan, "
                           f"links {res['links_us']:.0f} us"), "scan_us")


def alternate(other: Path | None, rounds: int, measure: Callable[[Path], dict[str, float]],
              describe: Callable[[dict[str, float]], str], key: str) -> None:
    """Measure this checkout and ``other`` (when given) in turn, ``rounds`` times, printing each round; then the best
    round of each (the lowest ``key``) as name=value pairs, ``old_`` for ``other`` (bench/docks.py uses it too)."""
    trees = [("", ROOT)] + ([("old_", other.resolve())] if other else [])
    best: dict[str, dict[str, float]] = {}
    for r in range(rounds):
        for prefix, tree in trees:
            res = measure(tree)
            print(f"round {r + 1} {tree}: {describe(res)}", flush=True)
            if prefix not in best or res[key] < best[prefix][key]:
                best[prefix] = res
    print(" ".join(f"{p}{k}={v:.0f}" for p, res in best.items() for k, v in res.items()))


if __name__ == "__main__":
    main()
