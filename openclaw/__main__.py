"""`python -m openclaw`: the same command as `openclaw`."""

import sys

from openclaw.cli import main

sys.exit(main())
