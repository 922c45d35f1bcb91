"""Facts about NVIDIA hardware shared by sources, rules and the exporter (no I/O, no pynvml)."""
