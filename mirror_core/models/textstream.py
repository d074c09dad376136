"""UTF-8-safe incremental detokenisation for front-ends (CLI, UI); the engine itself never sees text."""
from __future__ import annotations


class IncrementalText:
    """Decode the accumulated ids and emit only the new suffix; hold back text ending in U+FFFD."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return ""  # an incomplete multi-byte character (or a merge that rewrote earlier text): wait
        new, self.emitted = text[len(self.emitted):], text
        return new

    def flush(self) -> str:
        """Whatever is left at the end (a dangling partial character is shown as U+FFFD)."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        new = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return new
