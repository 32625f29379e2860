"""ddpwatch: catches hangs in distributed PyTorch training and says which rank, which line, why, and the fix."""

from .config import ConfigError
from .session import guard, install, uninstall

__version__ = "0.1.0"
__all__ = ["guard", "install", "uninstall", "ConfigError", "__version__"]
