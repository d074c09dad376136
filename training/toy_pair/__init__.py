"""The toy pair (a 10-layer target, an AR draft and an SS draft) trained from scratch on the CPython stdlib:
`python -m training.toy_pair --out DIR`, then `python -m training.toy_pair.evaluate DIR` re-measures its card."""
