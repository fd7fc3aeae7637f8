"""`python -m openclaw.cli`: the same command as `openclaw` (the unit runs it this way when no
`openclaw` script was started)."""

import sys

from openclaw.cli.main import main

sys.exit(main())
