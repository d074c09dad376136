"""Offline training of the bundled model pair (`python -m mirror_core.train`); nothing at runtime imports it."""
