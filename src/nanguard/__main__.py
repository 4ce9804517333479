"""``python -m nanguard`` is the ``nanguard`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
