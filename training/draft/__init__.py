"""A draft and an early-exit head distilled from a pretrained target (the SmolLM2 pair in assets/smollm2_pair):
the target's own chat answers (chat_data), then the feature-reading draft (feature_distill) or a token-only
draft (distill), and the pair's model card (card)."""
