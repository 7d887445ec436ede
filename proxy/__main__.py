"""`python -m proxy ...`: see proxy/cli.py and docs/CLI.md."""

import sys

from .cli import main

sys.exit(main())
