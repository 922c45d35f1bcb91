"""HPC (Slurm) jobs per GPU from a job-mapping directory, in dcgm-exporter's ``--hpc-job-mapping-dir`` format.

One file per GPU, named by the GPU's index (``0``, ``1``, ...; no leading zeros: ``0003`` is skipped and counted,
so that it and ``3`` never compete for GPU 3), holding the ids of the jobs using it, one per line;
a workload manager's prolog writes it and its epilog removes it. Sites that feed dcgm-exporter this way can point
gpuwatchd at the same directory. Files with other names are ignored; blank lines are skipped.

The directory is written by scripts, so it is read within bounds: names are GPU indexes in ASCII digits (an
Arabic-Indic or fullwidth digit is not a GPU index), at most :data:`MAX_ENTRIES` entries are looked at, a file
must be a regular file of at most :data:`MAX_FILE_BYTES` (a FIFO would block the read) and a job id is at most
:data:`MAX_JOB_CHARS` visible ASCII characters (it becomes the ``hpc_job`` label). What is skipped is counted in
``JobMap.skipped`` with the first reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatchd.sources.attribution.small_files import read_small
from gpuwatchd.textint import ascii_uint

MAX_FILE_BYTES = 16 << 10  # a few jobs per GPU; a larger file is skipped (and counted)
MAX_JOBS_PER_GPU = 16  # bounded label values: more jobs on one GPU than this are cut (sorted, first kept)
MAX_GPU_INDEX = 1023  # more GPUs than any host has; a file named past it is not a GPU's
MAX_ENTRIES = 10_000  # entries of the directory looked at per refresh (a directory of 1M files stays cheap)
MAX_JOB_CHARS = 64  # Slurm "1234_5" / "1234+1", PBS "1234.server", LSF "1234[5]" fit many times over
# Visible ASCII without ',' (joins the ids of a shared GPU), '"' and '\' (quoted in the exposition format)
_JOB_ID = re.compile(rf"[!#-+\-.-\[\]-~]{{1,{MAX_JOB_CHARS}}}")


@dataclass(slots=True)
class JobMap:
    """GPU index -> job ids (sorted), and what was skipped (files, lines, entries past the bound)."""

    jobs: dict[int, tuple[str, ...]] = field(default_factory=dict)
    skipped: int = 0
    first_problem: str | None = None

    def skip(self, problem: str) -> None:
        self.skipped += 1
        if self.first_problem is None:
            self.first_problem = problem


def read_jobs(directory: Path) -> JobMap:
    """The mapping directory's jobs per GPU. Raises OSError when the directory cannot be listed. Blocking: the
    daemon runs it in a thread."""
    out = JobMap()
    with os.scandir(directory) as it:
        for n, entry in enumerate(it):
            if n >= MAX_ENTRIES:
                out.skip(f"more than {MAX_ENTRIES} entries in {directory}; the rest not read")
                break
            index = ascii_uint(entry.name, 4)
            if index is None or index > MAX_GPU_INDEX:
                continue  # not a GPU's file (README, a Unicode-digit name, 99999)
            if entry.name != str(index):
                # "0003" beside "3": both were GPU 3 and whichever the directory listed last won. Only the index
                # as written for it (dcgm-exporter matches the name as a string, so it never read "0003" either).
                out.skip(f"{entry.path}: not a GPU index as written (leading zeros); GPU {index}'s file is "
                         f"{directory / str(index)}")
                continue
            try:
                raw = read_small(entry.path, MAX_FILE_BYTES)
            except FileNotFoundError:
                continue  # removed by an epilog between listing and reading
            except OSError as e:
                out.skip(f"{entry.path}: {e.strerror or type(e).__name__}")
                continue
            jobs: set[str] = set()
            for line in raw.decode("utf-8", "replace").splitlines():
                j = line.strip()
                if not j:
                    continue
                if _JOB_ID.fullmatch(j) is None:
                    out.skip(f"{entry.path}: not a job id (1..{MAX_JOB_CHARS} visible ASCII characters, no ',')")
                    continue
                jobs.add(j)
            if jobs:
                out.jobs[index] = tuple(sorted(jobs)[:MAX_JOBS_PER_GPU])
    return out


def job_label(jobs: tuple[str, ...]) -> str:
    """The ``hpc_job`` label of a GPU used by these jobs: the id, or the ids joined with ',' when shared."""
    return ",".join(jobs)
