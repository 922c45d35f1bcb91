"""Data sources, split by process: the NVML worker (``nvml/worker/``, the only pynvml importer) and its supervisor
(``nvml/``), the kernel log (``kmsg/``), sysfs (``sysfs/``: PCIe links, Thunderbolt docks), process attribution."""
