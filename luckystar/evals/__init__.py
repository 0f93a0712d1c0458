"""Held-out evaluation: the core every stage logs (`core.evaluate`), suites and reports on top."""
