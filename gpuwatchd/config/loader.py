"""Typed, validated configuration: one YAML file, defaults in one place, errors that name the key path.

``check-config``, start-up and SIGHUP reload all go through :func:`load_config`. The sections are msgspec
``Struct`` classes (frozen, unknown keys refused); msgspec converts and checks each value, and
:func:`gpuwatchd.config.types.validate` reports every problem at once by key path, as
``notify.receivers[0].url: not a URL``.

Sub-sections owned by a subsystem live next to it (``gpuwatchd.rules.config``, ``gpuwatchd.notify.config``) and
are composed here.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from gpuwatchd.config.attribution import AttributionConfig
from gpuwatchd.config.files import InputFileError, read_text_file, shown_path
from gpuwatchd.config.kernel_log import KernelLogConfig
from gpuwatchd.config.paths import DEFAULT_CONFIG_PATH
from gpuwatchd.config.safe_yaml import load_yaml
from gpuwatchd.config.training import TrainingConfig
from gpuwatchd.config.types import (
    Duration,
    FieldError,
    PositiveDuration,
    SafePath,
    Section,
    ValidationError,
    problem_lines,
    validate,
    yaml_error_message,
)
from gpuwatchd.notify.config import NotifyConfig
from gpuwatchd.probes.config import ProbesConfig
from gpuwatchd.remediation.config import RemediationConfig
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.web.config import ExporterConfig, HttpConfig

# 9945: free in the Prometheus default-port allocation wiki at the time of writing, and clear of
# node_exporter (9100), dcgm-exporter (9400) and nvidia_gpu_exporter (9835).
DEFAULT_PORT = 9945
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
DEFAULT_STATE_DIR = Path("/var/lib/gpuwatchd")
MIN_POLL_TIMEOUT = 0.05
# Faster than 100 polls a second only burns CPU: NVML's own sample periods are 1/6 s and longer.
MIN_POLL_INTERVAL = 0.01
# Points kept per GPU and per process series: a day at 1 s; the default (1 h at 5 s) keeps 720.
MAX_HISTORY_POINTS = 86_400


class NvmlConfig(Section, frozen=True):
    """How the NVML worker (a child process) is run."""

    # How often every GPU is read. 1 s matches nvidia-smi dmon and DCGM's default; utilization is averaged over
    # the driver's own 1/6 s..1 s sample period anyway.
    poll_interval: Annotated[PositiveDuration, msgspec.Meta(ge=MIN_POLL_INTERVAL)] = 1.0
    # A GPU whose NVML calls block this long (while the others answer) is shown lost, reason timeout; a worker
    # silent this long past a due poll is killed and respawned. At least 50 ms: below that no poll of a real GPU
    # completes and the daemon would never show any data.
    poll_timeout: Annotated[PositiveDuration, msgspec.Meta(ge=MIN_POLL_TIMEOUT)] = 5.0
    # SIGTERM grace before SIGKILL when the worker must go.
    kill_grace: Duration = 1.0
    # Delay before respawning a worker that died or was killed; doubles per consecutive failure ...
    restart_backoff_initial: PositiveDuration = 0.5
    # ... up to this. Also how often a host without a driver is re-checked, so a driver installed later is found.
    restart_backoff_max: Duration = 30.0
    # Directory holding libnvidia-ml.so.1 (or the file itself). Unset: the system loader path, like nvidia-smi.
    library_path: SafePath | None = None

    def check(self) -> None:
        if self.restart_backoff_max < self.restart_backoff_initial:
            raise ValueError("restart_backoff_max must be >= restart_backoff_initial")


class ProcessesConfig(Section, frozen=True):
    """Per-process GPU memory."""

    # Per GPU, the processes with the most GPU memory that get their own series (bounds cardinality).
    top_n: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 10


class SysfsConfig(Section, frozen=True):
    """Where PCIe and Thunderbolt state is read from, independently of NVML."""

    # Prefix for /sys (tests and `gpuwatchd sim` point it at a fake tree).
    root: SafePath = Path("/")


class HistoryConfig(Section, frozen=True):
    """In-memory history the rules look back on (applied at start; a reload does not resize it)."""

    # How far back the rules can look; the leak rule's window must fit in it.
    retention: PositiveDuration = 3600.0
    # Resolution of the history: readings closer together than this replace each other.
    step: PositiveDuration = 5.0

    def check(self) -> None:
        if self.step > self.retention:
            raise ValueError("step must not exceed retention")
        if self.retention / self.step > MAX_HISTORY_POINTS:
            raise ValueError(f"retention/step is more than {MAX_HISTORY_POINTS} points per series (memory)")


# `host` when the file does not set it: this variable, else the hostname. Under Kubernetes the pod's hostname is the
# pod's name (new at every restart); the DaemonSet sets the variable to the node's name (the downward API's
# spec.nodeName), the name the fleet's rules and dashboards group by (deploy/kubernetes/daemonset.yaml).
HOST_ENV = "GPUWATCHD_HOST"
HOST_MAX_LENGTH = 255


def default_host() -> str:
    """``$GPUWATCHD_HOST`` when set and not blank, else this machine's hostname."""
    return os.environ.get(HOST_ENV, "").strip() or socket.gethostname()


class Config(Section, frozen=True):
    """The whole file. Every key is optional."""

    # HOST:PORT for /metrics, /healthz, /readyz and /api/v1/* (`[::]:9945`: IPv6 and IPv4); `run --listen` overrides it.
    # Changing it takes a restart.
    listen: str = DEFAULT_LISTEN
    # The `host` label on alerts and in messages. Unset: $GPUWATCHD_HOST (deploy/kubernetes sets it to the node's
    # name), else the hostname.
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=HOST_MAX_LENGTH)] = msgspec.field(
        default_factory=default_host)
    # Alert state and the notification outbox (SQLite). Unset: $STATE_DIRECTORY under systemd, else
    # /var/lib/gpuwatchd if writable, else ~/.local/state/gpuwatchd. Changing it takes a restart.
    state_dir: SafePath = DEFAULT_STATE_DIR
    nvml: NvmlConfig = NvmlConfig()
    processes: ProcessesConfig = ProcessesConfig()
    sysfs: SysfsConfig = SysfsConfig()
    history: HistoryConfig = HistoryConfig()
    rules: RulesConfig = RulesConfig()
    notify: NotifyConfig = NotifyConfig()
    kernel_log: KernelLogConfig = KernelLogConfig()
    probes: ProbesConfig = ProbesConfig()
    attribution: AttributionConfig = AttributionConfig()
    # PyTorch's allocator from inside training processes, over a local socket (docs/training.md).
    training: TrainingConfig = TrainingConfig()
    # Acting on the GPUs' health: drain the Slurm node (docs/remediation.md). Off unless configured.
    remediation: RemediationConfig = RemediationConfig()
    http: HttpConfig = HttpConfig()
    exporter: ExporterConfig = ExporterConfig()
    # TLS and basic auth for every endpoint: a web config file in the Prometheus exporter-toolkit format (the one
    # node_exporter reads with --web.config.file; docs/security.md). Unset: plain HTTP, no auth. `run
    # --web.config.file` overrides it. Read at start; changing it or the files it names takes a restart.
    web_config_file: SafePath | None = None

    @classmethod
    def _check_listen(cls, v: str, data: dict[str, Any]) -> str:
        parse_listen(v)
        return v

    @classmethod
    def _check_web_config_file(cls, v: Path | None, data: dict[str, Any]) -> Path | None:
        if v is not None:
            from gpuwatchd.web.webconfig import WebConfigError, load_web_config

            try:
                load_web_config(v)
            except WebConfigError as e:
                raise ValueError(f"{shown_path(v)}: {e}") from None
        return v

    @classmethod
    def before(cls, data: dict[str, Any]) -> dict[str, Any]:
        # $GPUWATCHD_HOST stands in for an unset `host`: checked as the key would be, its error naming the variable.
        env = os.environ.get(HOST_ENV, "").strip()
        if "host" not in data and env:
            if len(env) > HOST_MAX_LENGTH:
                raise FieldError("host", f"${HOST_ENV} is longer than {HOST_MAX_LENGTH} characters")
            if not env.isprintable():
                raise FieldError("host", f"${HOST_ENV} must not contain control characters")
        return data

    @classmethod
    def _check_host(cls, v: str, data: dict[str, Any]) -> str:
        # A label value and a line of every message: control characters would break both.
        if not v.isprintable():
            raise ValueError("must not contain control characters")
        return v


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6, ``:PORT`` for all interfaces) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or len(port) > 5 or not 0 <= int(port) <= 65535:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise ValueError(f"expected HOST:PORT, got {shown!r}")
    if host.startswith("[") != host.endswith("]") or host.count("[") > 1 or host.count("]") > 1:
        raise ValueError(f"expected HOST:PORT with an IPv6 host in brackets ([::1]:PORT), got {value[:80]!r}")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - an exporter listens on all interfaces by default
    return host, int(port)


class ConfigError(Exception):
    """A config file that cannot be used; ``str`` lists one ``key.path: message`` per line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))

    def __str__(self) -> str:
        return problem_lines(self.source, self.problems)


def config_from_dict(data: dict[str, Any] | None, source: str = "<config>") -> Config:
    """Validate a parsed YAML document."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of settings"])
    try:
        return validate(Config, data)
    except ValidationError as e:
        raise ConfigError(source, e.problems) from None


def load_config(path: Path | None, *, required: bool = False) -> Config:
    """Load ``path``; a missing default file gives the defaults, a missing explicit file is an error.

    The file is read with a size cap and never blocks (``config/files.py``); YAML is parsed within bounds
    (``config/safe_yaml.py``): every hostile file ends in one :class:`ConfigError`.
    """
    if path is None:
        path = DEFAULT_CONFIG_PATH
        if not path.exists():
            return Config()
    src = shown_path(path)
    try:
        text = read_text_file(path)
    except InputFileError as e:
        if str(e) == "file not found" and not required:
            return Config()
        raise ConfigError(src, [str(e)]) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(src, [yaml_error_message(e)]) from None
    return config_from_dict(data, src)
