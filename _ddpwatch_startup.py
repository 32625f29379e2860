"""ddpwatch's start-up hook: imported by ddpwatch-startup.pth only when DDPWATCH is set; imports nothing itself.

A .pth file runs while site.py is still adding folders to sys.path (a virtualenv's base site-packages, the user
site), so importing ddpwatch from there could miss torch. This module only waits for the end of site.py (its
`import sitecustomize`, always attempted), then hands over to ddpwatch.bootstrap.process_startup().
"""

import sys

_TRIGGERS = ("sitecustomize", "usercustomize")
attempted = False  # set once start() has run: `ddpwatch run`'s sitecustomize then stays quiet, even after a failure


class _AfterSite:
    """A sys.meta_path entry that finds nothing; the first lookup of sitecustomize starts ddpwatch, once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _TRIGGERS:
            start()
        return None

    def invalidate_caches(self):
        pass


def install():
    """Called by the .pth line: start ddpwatch once site.py has finished setting up sys.path."""
    try:
        if not any(isinstance(finder, _AfterSite) for finder in sys.meta_path):
            sys.meta_path.insert(0, _AfterSite())
    except Exception as exc:
        _warn(exc)


def start():
    global attempted
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _AfterSite)]
    if attempted:
        return
    attempted = True
    try:
        from ddpwatch.bootstrap import process_startup
    except Exception as exc:
        _warn(exc)
        return
    process_startup(via="pth")  # never raises; a bad setting is one warning line here


def _warn(exc):
    try:
        sys.stderr.write(f"ddpwatch: start-up hook failed ({type(exc).__name__}: {exc}); this process runs unwatched\n")
    except Exception:
        pass
