"""Helpers several test files share, one module for each kind of thing they hold. Pytest collects
only test_*.py, so nothing here runs as a test; fixtures that one folder shares live in its
conftest.py instead."""
