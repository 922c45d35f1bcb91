"""CPU of the hot-plug watch's PCI scan (``sysfs/pcie.nvidia_devices``) on a host with many PCI functions.

    python bench/pci_scan.py [--devices 300] [--gpus 8] [--scans 200] [--rounds 2] [--tree OTHER_CHECKOUT]

A synthetic ``sys/bus/pci/devices`` tree laid out as the kernel's (directories under ``sys/devices``, symlinks in
the bus directory) with ``--devices`` functions that are not GPUs (bridges, NICs, NVMe: what a large server lists;
the bench's daemon has no PCI tree at all, so ``footprint.py`` never shows this) and ``--gpus`` NVIDIA GPUs, each
with its HDMI audio function. Then ``--scans`` scans, as the watch makes one a second, each timed with
``time.thread_time`` (CPU of this thread), the cache kept between them when the tree has one (``PciScanCache``);
also the ``open`` calls of a steady scan. Each tree runs in its own child process; with ``--tree`` the other
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, devices: int, gpus: int) -> None:
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True)

    def add(bdf: str, vendor: str, cls: str) -> None:
        d = root / "sys/devices/pci0000:00" / bdf
        d.mkdir(parents=True)
        for name, text in (("vendor", vendor), ("class", cls), ("device", "0x1234")):
            (d / name).write_text(text + "\n")
        (links / bdf).symlink_to(f"../../../devices/pci0000:00/{bdf}")

    for i in range(devices):
        add(f"0000:{i // 32:02x}:{i % 32:02x}.{i % 8}", ("0x8086", "0x15b3", "0x144d")[i % 3], "0x060400")
    for g in range(gpus):
        add(f"0000:{0x80 + g:02x}:00.0", "0x10de", "0x030200")
        add(f"0000:{0x80 + g:02x}:00.1", "0x10de", "0x040300")


def child(devices: int, gpus: int, scans: int) -> dict[str, float]:
    from gpuwatchd.sources.sysfs import pcie

    cache_type = getattr(pcie, "PciScanCache", None)
    cache = cache_type() if cache_type is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, devices, gpus)

        def scan() -> set[str]:
            return pcie.nvidia_devices(root, cache) if cache is not None else pcie.nvidia_devices(root)

        assert len(scan()) == gpus
        times = []
        for _ in range(scans):
            t0 = time.thread_time()
            scan()
            times.append(time.thread_time() - t0)
        opens = 0
        real_open = os.open

        def counting_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
            nonlocal opens
            opens += 1
            return real_open(path, flags, mode)

        setattr(os, "open", counting_open)  # noqa: B010 (the module the reader calls os.open through)
        scan()
        setattr(os, "open", real_open)  # noqa: B010
    return {"scan_us": statistics.median(times) * 1e6, "opens": float(opens)}


def run(tree: Path, devices: int, gpus: int, scans: int) -> dict[str, float]:
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'bench')!r});"
            f" import pci_scan; print(json.dumps(pci_scan.child({devices}, {gpus}, {scans})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=300)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scans", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tree", type=Path, help="another checkout, measured alternately")
    a = ap.parse_args()
    trees = [("", ROOT)] + ([("old_", a.tree.resolve())] if a.tree else [])
    best: dict[str, dict[str, float]] = {}
    for r in range(a.rounds):
        for prefix, tree in trees:
            res = run(tree, a.devices, a.gpus, a.scans)
            print(f"round {r + 1} {tree}: scan {res['scan_us']:.0f} us, {res['opens']:.0f} opens a steady scan")
            if prefix not in best or res["scan_us"] < best[prefix]["scan_us"]:
                best[prefix] = res
    print(" ".join(f"{p}{k}={v:.0f}" for p, res in best.items() for k, v in res.items()))


if __name__ == "__main__":
    main()
