"""``python -m gpuwatchd``: the same as the ``gpuwatchd`` command."""

import sys

from gpuwatchd.cli import main

sys.exit(main())
