"""gpuwatchd: a per-host GPU monitoring daemon (NVML + host), Prometheus exporter and alert notifier."""

__version__ = "0.1.0"
