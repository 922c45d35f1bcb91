"""HPC (Slurm) jobs per GPU from a job-mapping directory, in dcgm-exporter's ``--hpc-job-mapping-dir`` format.

One file per GPU, named by the GPU's index (``0``, ``1``, ...), holding the ids of the jobs using it, one per line;
a workload manager's prolog writes it and its epilog removes it. Sites that feed dcgm-exporter this way can point
gpuwatchd at the same directory. Files with other names are ignored; blank lines are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_FILE_BYTES = 64 << 10  # a few jobs per GPU; a runaway file is read only this far
MAX_JOBS_PER_GPU = 16  # bounded label values: more jobs on one GPU than this are cut (sorted, first kept)


def read_jobs(directory: Path) -> dict[int, tuple[str, ...]]:
    """GPU index -> job ids (sorted). Raises OSError when the directory cannot be listed."""
    out: dict[int, tuple[str, ...]] = {}
    with os.scandir(directory) as it:
        for entry in it:
            if not entry.name.isdigit() or not entry.is_file():
                continue
            try:
                with open(entry.path, "rb") as f:
                    raw = f.read(MAX_FILE_BYTES)
            except OSError:
                continue  # removed by an epilog between listing and reading
            jobs = sorted({j for line in raw.decode("utf-8", "replace").splitlines()
                           if (j := line.strip()) and j.isprintable()})
            if jobs:
                out[int(entry.name)] = tuple(jobs[:MAX_JOBS_PER_GPU])
    return out


def job_label(jobs: tuple[str, ...]) -> str:
    """The ``hpc_job`` label of a GPU used by these jobs: the id, or the ids joined with ',' when shared."""
    return ",".join(jobs)
