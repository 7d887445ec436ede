"""`python -m dashboard ...`: the same as `proxy dashboard ...`."""

import sys

from .server import main

sys.exit(main())
