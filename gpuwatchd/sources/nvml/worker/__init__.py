"""What runs in the NVML child process (``python -m gpuwatchd.sources.nvml.worker.main``): the only pynvml importer.

Importing this package, which happens before any of its modules imports pynvml, puts a stand-in for
``ctypes.util`` in place (:mod:`gpuwatchd.sources.nvml.worker.lazy_ctypes_util`: pynvml imports ``find_library``
and never calls it; the real module is loaded on first use)."""

from gpuwatchd.sources.nvml.worker import lazy_ctypes_util

lazy_ctypes_util.install()
