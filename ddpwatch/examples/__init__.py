"""Runnable example training scripts: the seed stall and its fixed twin (used by the demo and the tests)."""
