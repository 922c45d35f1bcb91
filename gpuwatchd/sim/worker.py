"""The NVML worker under the simulator: ``python -m gpuwatchd.sim.worker '<json options>'``.

The production worker (:mod:`gpuwatchd.sources.nvml.worker.main`) with one difference: the host facts of GPU processes
(name, user, RSS) come from the sim state (:mod:`gpuwatchd.sim.resolver`), because the stand-in's pids do not
exist on this host. ``gpuwatchd sim`` and tests pass :data:`WORKER_MODULE` to the daemon or the supervisor;
importing this module for that constant does not load pynvml (the worker's modules are imported in ``main``).
"""

from __future__ import annotations

import sys

WORKER_MODULE = "gpuwatchd.sim.worker"


def main() -> int:
    from gpuwatchd.sim.resolver import from_env
    from gpuwatchd.sources.nvml.worker import main as nvml_worker  # imports pynvml: loaded in the worker process only
    from gpuwatchd.sources.nvml.worker.readings import worker_log

    return nvml_worker.main(resolver=lambda: from_env(log=worker_log))


if __name__ == "__main__":
    sys.exit(main())
