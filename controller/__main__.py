"""``python -m controller``: see controller/cli/main.py."""

import sys

from controller.cli.main import main

sys.exit(main())
