"""The ddsim command line."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print("ddsim: the audit command is not yet available", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
