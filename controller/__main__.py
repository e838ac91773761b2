"""``python -m controller``: see controller/cli.py."""

import sys

from controller.cli import main

sys.exit(main())
