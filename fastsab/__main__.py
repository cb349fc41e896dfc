"""``python -m fastsab``: the same as the ``fastsab`` console script."""

import sys

from fastsab.cli import main

sys.exit(main())
