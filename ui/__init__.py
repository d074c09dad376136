"""The Gradio playground. Importing this package loads no model and reads no environment or argv;
app.py creates the EngineLoader, calls build_demo(...) and launches."""
from .layout import CSS, LAUNCH, build_demo
from .loader import EngineLoader, ModelPolicy, PairPreset, default_presets
from .settings import load_examples

__all__ = ["CSS", "LAUNCH", "EngineLoader", "ModelPolicy", "PairPreset", "build_demo", "default_presets", "load_examples"]
