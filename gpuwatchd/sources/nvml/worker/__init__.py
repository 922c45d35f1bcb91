"""What runs in the NVML child process (``python -m gpuwatchd.sources.nvml.worker.main``): the only pynvml importer.

Importing this package, which happens before any of its modules imports pynvml or psutil, puts stand-ins in place
for the standard-library modules those import at start and the worker never uses (``ctypes.util``, ``subprocess``,
``datetime``, ``base64``, ``glob``): :mod:`gpuwatchd.sources.nvml.worker.stand_ins`, which loads the
real module on first use."""

from gpuwatchd.sources.nvml.worker import stand_ins

stand_ins.install_all()
