"""Brings a document of any readable format version up to the current one, so old folders keep loading. No torch."""

from __future__ import annotations

from .version import FORMAT_VERSION

# format_version -> a function that turns a document of that version into the current one. Version 1 is the
# current one; a future version 2 adds an entry `1: _upgrade_1_to_2` here so old folders keep loading.
UPGRADES: dict = {}


def upgrade(doc: dict) -> dict:
    """Bring a document of any readable version up to FORMAT_VERSION."""
    while doc.get("format_version") != FORMAT_VERSION and doc.get("format_version") in UPGRADES:
        doc = UPGRADES[doc["format_version"]](doc)
    return doc
