"""`python -m ddpwatch`: the same as the `ddpwatch` command."""

import sys

from .cli import main

sys.exit(main())
