"""On the training thread: the patched collectives and what they record (no thread of its own, nothing from watch)."""
