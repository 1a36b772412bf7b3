"""``python -m ddsim``: the command line (ddsim.cli)."""
import sys

from ddsim.cli import main

sys.exit(main())
