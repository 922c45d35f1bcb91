"""What runs in the NVML child process (``python -m gpuwatchd.sources.nvml.worker.main``): the only pynvml importer."""
