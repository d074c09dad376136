"""Test helpers shared by tests/ and scripts/ (never imported by the app or the engine): tiny model pairs
built from configs, greedy references, and the reliability harness."""
