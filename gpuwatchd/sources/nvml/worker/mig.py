"""MIG devices as devices of their own, inside the NVML worker (imports pynvml; only the worker loads it).

A GPU in MIG mode is split into MIG devices (one per compute instance). Each is read through its MIG device
handle (nvml.h ``nvmlDeviceGetMigDeviceHandleByIndex``) and reported as a ``GpuSample`` of its own, keyed by its
``MIG-...`` UUID, with ``parent_uuid``, ``gpu_instance_id``, ``compute_instance_id`` and ``profile``, right after
its GPU in the snapshot. What a MIG handle answers is per instance: memory and the processes running in it
(nvml.h: "per-instance information can be queried by using specific MIG device handles"). Everything physical
(temperature, power, clocks, PCIe, ECC, fans) stays on the GPU, which in MIG mode lists no processes of its own:
its process list is the aggregate of its instances', which are attributed to the instances instead. GPM activity
(Hopper and newer) is per GPU instance: a MIG device has its GPU instance's, sampled on the GPU with
``nvmlGpmMigSampleGet`` (:class:`~gpuwatchd.sources.nvml.worker.gpm.GpmReading`), where the GPU supports GPM.

The profile (``1g.10gb``) is taken from the MIG device's name: drivers name MIG devices
``"<GPU name> MIG <profile>"`` (nvml.h ``nvmlDeviceGetName``: "MIG device names which can be used to identify
devices based on their attributes"); that is one call at enumeration, where the GPU-instance profile tables
(``nvmlDeviceGetGpuInstanceById`` + ``nvmlGpuInstanceGetInfo`` + ``nvmlDeviceGetGpuInstanceProfileInfoV``) would
be three, on a privileged handle type.

MIG devices are enumerated when their GPU is opened. A changed MIG configuration is noticed per poll at little
cost -- MIG mode switched (the GPU's own ``mig_mode_current`` reading), a device appearing in a slot that was
empty (one empty slot probed a poll, in turn), a MIG handle the driver no longer accepts (a destroyed instance:
INVALID_ARGUMENT / NOT_FOUND, confirmed by its slot), or a MIG device whose size changed under its old handle --
and answered with the worker's re-enumeration (a fresh worker opens everything again).
"""

from __future__ import annotations

import pynvml as N

from gpuwatchd.sources.nvml.worker.errors import LOST_CODES, NvmlGpuLost, reason
from gpuwatchd.sources.nvml.worker.gpm import GpmReading
from gpuwatchd.sources.nvml.worker.readings import DeviceReadings, worker_log

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    Out = dict[str, Any]

# The readings a MIG device has (nvml_readings.readings() names); the rest are the GPU's.
MIG_READINGS = frozenset({"memory_used_bytes"})
# A MIG handle the driver no longer accepts: its instance was destroyed (nvml.h nvmlDeviceGetMigDeviceHandleByIndex).
_GONE = frozenset({N.NVML_ERROR_INVALID_ARGUMENT, N.NVML_ERROR_NOT_FOUND})
_GONE_REASONS = frozenset(reason(c) for c in _GONE)


def profile_of(name: str | None) -> str | None:
    """``"NVIDIA A100-SXM4-80GB MIG 1g.10gb"`` -> ``"1g.10gb"`` (also ``"MIG 1g.10gb"``); None when not named so."""
    if not name:
        return None
    head, sep, tail = name.rpartition("MIG ")
    if not sep or (head and not head.endswith(" ")) or not tail or " " in tail:
        return None
    return tail


def _lost(e: N.NVMLError, call: str) -> None:
    if e.value in LOST_CODES:
        raise NvmlGpuLost(e.value, call) from None


def _optional(fn: Any, handle: Any) -> Any:
    """An identity reading a driver may refuse (an older one without the call): None; GPU loss propagates."""
    try:
        return fn(handle)
    except N.NVMLError as e:
        _lost(e, fn.__name__)
        return None


class MigDevice:
    """One MIG device: its handle, identity and readings (memory; processes through the worker's listers)."""

    __slots__ = ("_identity", "compute_instance_id", "gpu_instance_id", "handle", "index", "memory_total", "name",
                 "profile", "readings", "uuid")

    def __init__(self, index: int, handle: Any, gpu: Any) -> None:
        """``gpu``: its GPU's handle, for the GPU-instance GPM samples."""
        self.index = index
        self.handle = handle
        self._identity: Out | None = None
        self.memory_total: int | None = None  # as first read: a MIG device's size is fixed by its profile
        self.uuid: str = N.nvmlDeviceGetUUID(handle)
        self.name: str | None = _optional(N.nvmlDeviceGetName, handle)
        self.profile = profile_of(self.name)
        self.gpu_instance_id: int | None = _optional(N.nvmlDeviceGetGpuInstanceId, handle)
        self.compute_instance_id: int | None = _optional(N.nvmlDeviceGetComputeInstanceId, handle)
        self.readings = DeviceReadings(handle, MIG_READINGS)
        if self.gpu_instance_id is not None:
            # GPM of its GPU instance, sampled on the GPU (nvmlGpmMigSampleGet) where the GPU supports GPM.
            self.readings.gpm = GpmReading(gpu, self.gpu_instance_id)
        else:
            self.readings.gpm.absent = True  # no instance id to ask for

    def identity(self, parent_uuid: str, parent_index: int) -> Out:
        """The start of its snapshot entry (``GpuSample`` fields); its GPU's index, no PCI id of its own."""
        ident = self._identity
        if ident is None:  # static for the life of the worker: built once, copied per poll
            ident = self._identity = {
                "uuid": self.uuid, "index": parent_index, "name": self.name, "parent_uuid": parent_uuid,
                "gpu_instance_id": self.gpu_instance_id, "compute_instance_id": self.compute_instance_id,
                "profile": self.profile}
        return dict(ident)


class MigSet:
    """The MIG devices of one MIG-capable GPU, as enumerated when the GPU was opened."""

    __slots__ = ("_next_probe", "devices", "empty", "enabled", "handle", "max_count")

    def __init__(self, handle: Any, enabled: bool) -> None:
        self.handle = handle
        self.enabled = enabled
        self.devices: list[MigDevice] = []
        self.empty: list[int] = []  # slots without a MIG device: one probed per poll, in turn, for a new one
        self._next_probe = 0
        self.max_count = 0
        if not enabled:
            return
        try:
            self.max_count = N.nvmlDeviceGetMaxMigDeviceCount(handle)
        except N.NVMLError as e:
            _lost(e, "nvmlDeviceGetMaxMigDeviceCount")
            worker_log(f"MIG mode is on but its devices cannot be counted: {reason(e.value)}", "WARNING")
            return
        for i in range(self.max_count):
            try:
                self.devices.append(MigDevice(i, N.nvmlDeviceGetMigDeviceHandleByIndex(handle, i), handle))
            except N.NVMLError as e:
                _lost(e, "nvmlDeviceGetMigDeviceHandleByIndex")
                if e.value == N.NVML_ERROR_NOT_FOUND:
                    self.empty.append(i)
                else:  # not probed again: it would look created at every poll
                    worker_log(f"MIG device {i} of this GPU not opened (it is not reported): {reason(e.value)}",
                               "WARNING")

    @classmethod
    def open(cls, handle: Any) -> MigSet | None:
        """The GPU's MIG devices; None for a GPU without MIG (NOT_SUPPORTED, or a driver without the calls)."""
        try:
            current = N.nvmlDeviceGetMigMode(handle)[0]
        except N.NVMLError as e:
            _lost(e, "nvmlDeviceGetMigMode")
            return None
        return cls(handle, current == N.NVML_DEVICE_MIG_ENABLE)

    def close(self) -> None:
        """Free what the driver holds for the MIG devices' readings (GPM sample buffers)."""
        for m in self.devices:
            m.readings.close()

    def changed(self, gpu_out: Out) -> str | None:
        """Why the MIG configuration differs from the one enumerated (None: same); after the GPU's readings."""
        mode = gpu_out.get("mig_mode_current")
        if mode is not None and mode != self.enabled:
            return f"MIG mode turned {'on' if mode else 'off'}"
        if not self.empty:
            return None
        # One empty slot a poll: a MIG device created in any of them is seen within len(empty) polls, at one call
        # a poll instead of one per slot (an A100 with one MIG device has six empty slots).
        i = self.empty[self._next_probe % len(self.empty)]
        self._next_probe += 1
        try:
            N.nvmlDeviceGetMigDeviceHandleByIndex(self.handle, i)
        except N.NVMLError as e:
            _lost(e, "nvmlDeviceGetMigDeviceHandleByIndex")
            return None
        return f"MIG device created at index {i}"

    def device_changed(self, m: MigDevice, out: Out, errors: dict[str, str]) -> str | None:
        """Why MIG device ``m`` (just read into ``out``) is no longer the one enumerated, or None. Drivers may hand
        a re-created instance the old handle (nvml.h), so a changed size says so at no cost."""
        total = out.get("memory_total_bytes")
        if total is not None:
            if m.memory_total is None:
                m.memory_total = total
            elif total != m.memory_total:
                return f"MIG device {m.uuid} changed size ({m.memory_total} -> {total} bytes)"
        if errors and self.destroyed(m, errors):
            return f"MIG device {m.uuid} no longer answers"
        return None

    def destroyed(self, m: MigDevice, errors: dict[str, str]) -> bool:
        """Whether ``m``'s failed readings mean its instance was destroyed: they failed the way an invalid MIG handle
        does, and its slot no longer holds it (empty, or another MIG device). A reading that fails so while the
        instance is there is that reading's error, kept per poll like any other."""
        if not any(r in _GONE_REASONS for r in errors.values()):
            return False
        try:
            return bool(N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(self.handle, m.index)) != m.uuid)
        except N.NVMLError as e:
            _lost(e, "nvmlDeviceGetMigDeviceHandleByIndex")
            return e.value in _GONE


__all__ = ["MIG_READINGS", "MigDevice", "MigSet", "profile_of"]
