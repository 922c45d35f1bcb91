"""Data sources: the NVML worker (the only pynvml importer) and its supervisor, sysfs, host processes."""
