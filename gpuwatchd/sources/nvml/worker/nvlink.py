"""NVLink per link and the GPU recovery action (runs only inside the NVML worker process).

One ``NvLink`` object per device (``nvml_readings.readings()`` makes a fresh one per device) does two jobs:

- It adds its per-link field ids to the device's one ``nvmlDeviceGetFieldValues`` request
  (``nvml_readings._field_values``): per link, data throughput tx/rx (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``,
  scoped: ``scopeId`` = link) and the CRC flit / CRC data / replay / recovery error counters. nvml.h gives those
  four one id per link, ``NVML_FI_DEV_NVLINK_<COUNTER>_L<n>`` for links 0-5 (ids 32-58) and 6-11 (ids 96-119); the
  header also asks for the link in ``scopeId`` there, so both carry it. Links 12 and up (an H100 has 18) have no
  ``_L<n>`` id: they report state and throughput only.
- It reads the link state (``nvmlDeviceGetNvLinkState``, one call per link, the one state call every NVLink
  generation answers) and counts the active links.

The number of links is learned once, on the first poll, by asking link states until the driver answers
INVALID_ARGUMENT past the last link; NOT_SUPPORTED on link 0 means no NVLink, and the device asks no NVLink field
ids at all. The recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, one device-wide id) is a plain entry of
``nvml_readings.FIELD_VALUES``.
"""

from __future__ import annotations

from collections.abc import Callable

import pynvml as N

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    Handle = Any
    Out = dict[str, Any]
    # Writes one field value's number into the sample dict.
    Sink = Callable[[Out, int | float], None]

KIB = 1024  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_* count KiB (nvml.h)

# counter kind -> (the _L0 id, the _L6 id): links 0-5 are _L0 + link, links 6-11 are _L6 + link - 6 (nvml.h).
ERROR_IDS: dict[str, tuple[int, int]] = {
    "crc_flit": (N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6),
    "crc_data": (N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6),
    "replay": (N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6),
    "recovery": (N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6),
}
ERROR_ID_LINKS = 12  # _L0 .. _L11
THROUGHPUT_IDS: dict[str, int] = {
    "tx": N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    "rx": N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
}

def error_field_id(kind: str, link: int) -> int | None:
    """The ``_L<n>`` field id of one error counter on one link, or None past link 11."""
    if not 0 <= link < ERROR_ID_LINKS:
        return None
    first, sixth = ERROR_IDS[kind]
    return first + link if link < 6 else sixth + link - 6


def _error_sink(link: str, kind: str) -> Sink:
    def put(out: Out, number: int | float) -> None:
        out.setdefault("nvlink_errors_total", {}).setdefault(link, {})[kind] = int(number)

    return put


def _bytes_sink(link: str, direction: str) -> Sink:
    field = "nvlink_transmit_bytes_total" if direction == "tx" else "nvlink_receive_bytes_total"

    def put(out: Out, number: int | float) -> None:
        out.setdefault(field, {})[link] = int(number) * KIB

    return put


class NvLink:
    """Per-link NVLink readings of one device; the link count is learned on the first poll."""

    def __init__(self) -> None:
        self.links: int | None = None

    def learn(self, h: Handle) -> int:
        """The number of links (0: no NVLink), asked once."""
        if self.links is None:
            n = 0
            for link in range(N.NVML_NVLINK_MAX_LINKS):
                try:
                    N.nvmlDeviceGetNvLinkState(h, link)
                except N.NVMLError as e:
                    if e.value == N.NVML_ERROR_INVALID_ARGUMENT and link > 0:
                        break
                    if e.value == N.NVML_ERROR_NOT_SUPPORTED and link == 0:
                        break  # no NVLink on this GPU
                    raise
                n += 1
            self.links = n
        return self.links

    def field_requests(self, h: Handle) -> list[tuple[tuple[int, int], Sink]]:
        """((field id, scope id), sink) for every per-link value, in request order."""
        out: list[tuple[tuple[int, int], Sink]] = []
        for link in range(self.learn(h)):
            name = str(link)
            for direction, fid in THROUGHPUT_IDS.items():
                out.append(((fid, link), _bytes_sink(name, direction)))
            for kind in ERROR_IDS:
                eid = error_field_id(kind, link)
                if eid is not None:
                    out.append(((eid, link), _error_sink(name, kind)))
        return out

    def __call__(self, h: Handle, out: Out) -> None:
        links = self.learn(h)
        if not links:
            raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        states = {str(link): int(N.nvmlDeviceGetNvLinkState(h, link) == N.NVML_FEATURE_ENABLED)
                  for link in range(links)}
        out["nvlink_states"] = states
        out["nvlink_links_active"] = sum(states.values())
