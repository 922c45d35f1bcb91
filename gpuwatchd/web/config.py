"""The ``http`` config section: how the HTTP server protects itself from idle, slow and too many connections."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gpuwatchd.config.types import PositiveDuration, Section


class HttpConfig(Section, frozen=True):
    """Limits of the HTTP server (/metrics, /healthz, the API); changing them takes a restart."""

    # Open connections at most. At the cap, the connection idle longest is closed to make room; when every one is
    # busy with a request, the new one is refused. Also held below the open-file limit minus the descriptors the
    # daemon needs for itself (NVML worker pipes, SQLite, probes), whatever is set here.
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1000
    # A connection with no request under way is closed after this long (HTTP keep-alive). Prometheus reuses its
    # connection between scrapes only when this is longer than the scrape interval.
    idle_timeout: PositiveDuration = 120.0
    # A request's headers must arrive within this long of its first byte (a slowloris dribbles them); with TLS, the
    # handshake must also end within this long of the connection being accepted.
    header_timeout: PositiveDuration = 10.0

    def check(self) -> None:
        if self.header_timeout > self.idle_timeout:
            raise ValueError("header_timeout must be <= idle_timeout")


class ExporterConfig(Section, frozen=True):
    """What /metrics exports besides gpuwatchd's own families; changing it takes a restart."""

    # `dcgm`: also export dcgm-exporter's default counters under their DCGM_FI_* names, units and labels (gpu, UUID,
    # device, modelName, Hostname, pci_bus_id; GPU_I_ID / GPU_I_PROFILE on MIG instances), so dashboards and alert
    # rules written for dcgm-exporter work unchanged (docs/dcgm-compat.md: which counters map and which cannot).
    # Unset: gpuwatchd's own names only.
    compat: Literal["dcgm"] | None = None
