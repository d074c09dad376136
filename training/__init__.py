"""The lab wing: offline training of the shipped models, in two rooms.

- toy_pair/: the toy pair (assets/default_pair) trained from scratch: `python -m training.toy_pair --out DIR`.
- draft/: the SmolLM2 pair's distilled draft and exit head (assets/smollm2_pair): the target's chat answers
  (chat_data), then `feature_distill` (the shipped feature-reading draft) or `distill` (a token-only draft).

Both rooms share one budgeted training loop (loop.py) and the measured choice of dtype (precision.py). The engine
runs what this wing writes and never imports it: mirror_core/, ui/ and app.py import nothing from here
(tests/test_architecture.py).
"""
