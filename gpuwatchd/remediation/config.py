"""The ``remediation`` config section: acting on the GPUs' health (docs/remediation.md). Nothing acts unless
configured to: every part is off by default."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from gpuwatchd.config.types import Duration, PositiveDuration, SafePath, Section
from gpuwatchd.model.health import ACTIONS, HealthAction

STATE_FILE_NAME = "remediation.json"
# Health actions that take a GPU out of service until a person looks: a reset or a reboot cannot be done under a
# running job, and hardware to inspect is no place for the next one. restart_app and check_cable (an eGPU's cable)
# leave the node schedulable.
DEFAULT_DRAIN_ACTIONS: tuple[HealthAction, ...] = ("reset_gpu", "reboot", "inspect_hardware")
MAX_REASON_CHARS = 200  # Slurm shows the reason in `sinfo -R` and `scontrol show node`: one readable line


class SlurmConfig(Section, frozen=True):
    """Drain this host's Slurm node when a GPU's health takes it out of service, resume it when the GPUs recover
    (only a drain gpuwatchd set and nobody changed since)."""

    # Act at all. Off: gpuwatchd never runs scontrol.
    enabled: bool = False
    # Log, count and notify what would be done, without running `scontrol update`.
    dry_run: bool = False
    # The scontrol command (a bare name is looked up on PATH).
    scontrol: SafePath = Path("scontrol")
    # SLURM_CONF for scontrol. Unset: scontrol's own default (/etc/slurm/slurm.conf or $SLURM_CONF).
    slurm_conf: SafePath | None = None
    # This host's node name in Slurm. Unset: the short host name (what slurmd uses by default).
    node_name: Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._-]+$")] | None = None
    # A GPU whose health is unhealthy with one of these actions drains the node.
    drain_actions: tuple[HealthAction, ...] = DEFAULT_DRAIN_ACTIONS
    # The GPUs must have been out of that state this long before the node is resumed (a flapping GPU does not
    # flap the node).
    resume_after: Duration = 300.0
    # At most one scontrol update this often: a broken rule or GPU can never storm the controller.
    min_interval: Duration = 60.0
    # An scontrol call that takes longer is killed and counted as failed (a hung controller never stalls us).
    timeout: Annotated[PositiveDuration, msgspec.Meta(le=300.0)] = 20.0

    @classmethod
    def _check_drain_actions(cls, v: tuple[str, ...], data: dict[str, Any]) -> tuple[str, ...]:
        for a in v:
            if a not in ACTIONS or a == "none":
                raise ValueError(f"unknown action {a!r} (one of {', '.join(x for x in ACTIONS if x != 'none')})")
        return v


DEFAULT_NVSENTINEL_SOCKET = Path("/var/run/nvsentinel.sock")


class NvsentinelConfig(Section, frozen=True):
    """Send each GPU health change to NVSentinel's platform connector as a health event (its gRPC
    ``PlatformConnector.HealthEventOccurredV1`` on a unix socket): NVSentinel without DCGM or the GPU Operator."""

    # Send at all. Off: gpuwatchd never opens the socket (nor imports grpc for it).
    enabled: bool = False
    # The platform connector's socket (its Helm chart's default).
    socket: SafePath = DEFAULT_NVSENTINEL_SOCKET
    # The Kubernetes node name the events are about. Unset: $NODE_NAME (set it from spec.nodeName in the
    # DaemonSet), else the short host name.
    node_name: Annotated[str, msgspec.Meta(min_length=1, max_length=253)] | None = None
    # Mark every event STORE_ONLY: NVSentinel records and exports it but does not cordon, drain or remediate.
    dry_run: bool = False
    # A send that takes longer is abandoned, counted and retried after retry_interval.
    timeout: Annotated[PositiveDuration, msgspec.Meta(le=60.0)] = 5.0
    # Events not delivered are retried this often (the latest state per GPU, never a backlog).
    retry_interval: PositiveDuration = 30.0


class RemediationConfig(Section, frozen=True):
    """What gpuwatchd does about an unhealthy GPU beyond telling people (applied at start; a reload that changes it
    says a restart is needed)."""

    slurm: SlurmConfig = SlurmConfig()
    nvsentinel: NvsentinelConfig = NvsentinelConfig()
    # Where the decisions (what gpuwatchd drained, the escalation history, acknowledgements) are kept across
    # restarts. Unset: remediation.json in state_dir.
    state_file: SafePath | None = None

    def state_path(self, state_dir: Path) -> Path:
        return self.state_file if self.state_file is not None else state_dir / STATE_FILE_NAME
