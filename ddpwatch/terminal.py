"""Text from outside (a rank, a file, the store, a peer's words) made safe for a terminal, and the one way to say
something on stderr when nothing else may work. Imported by the renderers, the watchdog, the CLI and `ddpwatch dump`;
imports nothing of ddpwatch."""

from __future__ import annotations

import os
import re
import sys

# What a terminal would act on, or what makes text read other than it is stored: C0 controls (ESC starts window-title,
# clipboard (OSC 52) and clear-screen sequences; CR lets a line be overwritten by a fake one), DEL, C1 controls (0x9b
# alone is a CSI to many terminals), bidi marks, embeddings, overrides and isolates ("Trojan Source"), line and
# paragraph separators, and lone surrogates (no encoder writes one; os.fsdecode makes them of undecodable bytes).
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x08\x0a-\x1f{_BEYOND_C0}]")  # tab (0x09) stays: it moves the cursor, nothing more
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x08\x0b-\x1f{_BEYOND_C0}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match) -> str:
    char = match.group(0)
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte: show the byte, as git does
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def visible(text, keep_newlines: bool = False) -> str:
    """Text from outside (a rank, a file, the store) safe to print or write: every character a terminal would act
    on, and every lone surrogate, written out as an escape (ESC -> `\\x1b`, CR -> `\\r`), as git quotes a path.
    Tabs stay; newlines stay only with keep_newlines (a multi-line block); the result always encodes to UTF-8."""
    pattern = _UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE
    return pattern.sub(_escape, str(text))


def say(text: str) -> None:
    """Write to stderr whatever it is and whatever stderr is: the verdict must get out even when nothing else can.

    Lines here quote peers, the store and paths: control characters are shown, never acted on by the terminal."""
    text = visible(text, keep_newlines=True)
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    except Exception:
        pass
    try:  # a closed, replaced or strictly encoding sys.stderr: the bytes, straight to file descriptor 2
        os.write(2, text.encode("utf-8", "backslashreplace"))
    except Exception:
        pass
