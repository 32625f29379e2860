"""The format's version: which one ddpwatch writes, which it reads, and the error for anything else. No torch."""

from __future__ import annotations

from typing import Any

# What each format version changed (bump on any change a reader must know about):
#   1: first version: rank snapshots (records, stacks), incidents with findings. Optional fields added within it
#      (a reader that does not know them loses nothing it acts on): a finding's `basis` (fact or reading).
FORMAT_VERSION = 1
READABLE_VERSIONS = (1,)


class FormatError(ValueError):
    """A file or document that is not a ddpwatch snapshot or incident this version can read."""


def check_version(doc: Any, what: str) -> dict:
    if not isinstance(doc, dict):
        raise FormatError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    version = doc.get("format_version")
    if version not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS))
        raise FormatError(f"{what}: format_version {version!r} is not one this ddpwatch reads ({readable})")
    return doc
