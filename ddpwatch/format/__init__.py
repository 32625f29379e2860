"""The report format, torch-free: its version, types, builders, checks, upgrades, load and save (one owner)."""
