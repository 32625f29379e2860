"""Static analysis of the user's source: the rank-condition recogniser (lint and runtime share it), `ddpwatch lint`."""
