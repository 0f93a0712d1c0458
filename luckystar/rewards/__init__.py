"""Verifiers and rewards: each task type has one verifier; rules first, an optional judge after."""
