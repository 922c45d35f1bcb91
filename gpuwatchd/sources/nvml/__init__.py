"""NVML, daemon side: the supervisor of the worker process, its protocol, hang handling, snapshot intake, hotplug."""
