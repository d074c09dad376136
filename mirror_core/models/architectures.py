"""The architectures a runner supports, and where each keeps its decoder layers and final norm (the table
models/loading.py checks a config against and runners/hf.py walks a loaded model with)."""
from __future__ import annotations

from ..config import MirrorError

# model_type → (path to the decoder layer list, path to the final norm)
_LAYOUTS = {
    "llama": ("model.layers", "model.norm"),
    "mistral": ("model.layers", "model.norm"),
    "qwen2": ("model.layers", "model.norm"),
    "qwen3": ("model.layers", "model.norm"),
    "gpt2": ("transformer.h", "transformer.ln_f"),
}
SUPPORTED_MODEL_TYPES = tuple(_LAYOUTS)


def layout(model_type: str) -> tuple[str, str]:
    """(module path of the decoder layer list, module path of the final norm) for a supported architecture."""
    if model_type not in _LAYOUTS:
        raise MirrorError(f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return _LAYOUTS[model_type]
