"""Replay a real ``nvidia-smi -q -x`` dump: build the stand-in NVML driver's state from it (docs/sim-state.md).

``gpuwatchd sim --from-xml FILE`` uses this; so do the fidelity tests, which read every field back through the real
``pynvml``. Every ``<gpu>`` element becomes one device, in the dump's order (nvidia-smi lists GPUs in NVML index
order). Readings printed as "N/A" (or absent from an older schema) become ``None``: NOT_SUPPORTED in the stand-in.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET  # expat >= 2.4 refuses entity bombs; external DTDs are never fetched
from typing import Any

from gpuwatchd.config.files import MAX_XML_BYTES, InputFileError, read_text_file, shown_path
from gpuwatchd.sim.capture_device import CLOCK_EVENT_REASON_BITS, device_from_gpu
from gpuwatchd.sim.capture_values import CaptureError, text
from gpuwatchd.sim.standin_abi import MAX_SIM_GPUS

__all__ = ["CLOCK_EVENT_REASON_BITS", "CaptureError", "describe_capture", "parse_cuda_version", "state_from_xml"]

_ROOT_TAG = "nvidia_smi_log"
# nvidia-smi's XML nests 5-6 levels (nvidia_smi_log/gpu/ecc_errors/volatile/sram_correctable); 32 is far past it.
MAX_XML_DEPTH = 32


def state_from_xml(source: str | os.PathLike[str]) -> dict[str, Any]:
    """The stand-in state dict for an nvidia-smi XML dump, given as a path or as the XML text itself."""
    root = _load(source)
    count = sum(1 for _ in root.iterfind("gpu"))
    if count > MAX_SIM_GPUS:
        raise CaptureError(f"{_name(source)}: {count} <gpu> elements; the simulator plays at most {MAX_SIM_GPUS} GPUs")
    driver = text(root, "driver_version")
    cuda = text(root, "cuda_version")
    cuda_version = None if cuda is None else parse_cuda_version(cuda)
    devices = [device_from_gpu(gpu) for gpu in root.iterfind("gpu")]
    seen: set[str] = set()
    for device in devices:
        if device["uuid"] in seen:
            raise CaptureError(f"{_name(source)}: UUID {device['uuid']} appears on two <gpu> elements")
        seen.add(device["uuid"])
    return {
        "driver_version": driver,
        # NVML's version string is "<CUDA major>.<driver version>" (e.g. 12.535.161.08); the dump prints both parts.
        "nvml_version": None if driver is None or cuda_version is None else f"{cuda_version // 1000}.{driver}",
        "cuda_driver_version": cuda_version,
        "devices": devices,
    }


def describe_capture(source: str | os.PathLike[str]) -> str:
    """One line per GPU in the dump (index, name, UUID, bus id), for ``gpuwatchd sim --from-xml`` startup logs."""
    root = _load(source)
    return "\n".join(
        f"{index}: {text(gpu, 'product_name') or '?'} {text(gpu, 'uuid') or '?'} "
        f"{text(gpu, 'pci/pci_bus_id') or gpu.get('id', '?')}"
        for index, gpu in enumerate(root.iterfind("gpu"))
    )


def parse_cuda_version(value: str) -> int:
    """nvidia-smi's "12.2" as NVML's integer 12020 (major * 1000 + minor * 10)."""
    major, dot, minor = value.partition(".")
    if not dot or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in (major, minor)):
        raise CaptureError(f"cuda_version: expected '<major>.<minor>', got {value[:40]!r}")
    return int(major) * 1000 + int(minor) * 10


def _load(source: str | os.PathLike[str]) -> ET.Element:
    if isinstance(source, str) and source.lstrip().startswith("<"):
        data = source
    else:
        try:
            data = read_text_file(source, max_bytes=MAX_XML_BYTES)
        except InputFileError as error:
            reason = str(error).removeprefix("cannot read: ")
            raise CaptureError(f"{_name(source)}: cannot read the capture: {reason}") from None
    try:
        root = ET.fromstring(data)  # noqa: S314 - see the import: no entity expansion bombs, no network
    except ET.ParseError as error:
        raise CaptureError(f"{_name(source)}: not well-formed XML: {error}") from error
    if _depth(root) > MAX_XML_DEPTH:
        raise CaptureError(f"{_name(source)}: elements nested deeper than {MAX_XML_DEPTH} levels (not nvidia-smi's)")
    if root.tag != _ROOT_TAG:
        raise CaptureError(f"{_name(source)}: root element is <{root.tag}>, expected <{_ROOT_TAG}> (nvidia-smi -q -x)")
    return root


def _depth(root: ET.Element) -> int:
    deepest, stack = 0, [(root, 1)]
    while stack:
        element, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_XML_DEPTH:
            stack.extend((child, depth + 1) for child in element)
    return deepest


def _name(source: str | os.PathLike[str]) -> str:
    if isinstance(source, str) and source.lstrip().startswith("<"):
        return "<xml text>"
    return shown_path(source)
