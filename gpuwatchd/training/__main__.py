"""``python -m gpuwatchd.training train.py ARGS...`` (or ``-m package.module ARGS...``): run a training script
unchanged with the reporter on, as ``python train.py ARGS...`` would run it."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from gpuwatchd import training

USAGE = "usage: python -m gpuwatchd.training (SCRIPT | -m MODULE) [ARGS...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr if not argv or argv[0] == "-m" else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    training.watch()
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    finally:
        training.stop()  # the last figures, and the OOM that may have ended the run
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
