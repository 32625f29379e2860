"""Files here are lint fixtures (data for tests/test_lint.py): never collect or import them as tests."""

collect_ignore_glob = ["*.py"]
