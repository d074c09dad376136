"""Security defaults: local bind, no share link, no remote code unless asked (and then a warning on the page),
a Space's allowlist with local paths refused, safetensors only (see the catalogue's .bin rows), bounded requests."""
from __future__ import annotations

import re

import pytest

from mirror_core import MirrorError
from testing.reliability import INLINE, page_values
from testing.toy_models import build_pair
from ui import EngineLoader, ModelPolicy, PairPreset, build_demo, default_presets


def test_app_defaults_bind_localhost_without_share_or_remote_code(monkeypatch):
    import app

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    args = app.parse_args([])
    assert args.host == "127.0.0.1" and args.share is False and args.trust_remote_code is False
    args = app.parse_args(["--host", "0.0.0.0", "--share", "--trust-remote-code"])
    assert args.host == "0.0.0.0" and args.share and args.trust_remote_code


def test_trust_remote_code_is_passed_on_and_the_page_warns(tmp_path):
    calls = []
    loader = EngineLoader(INLINE, load=lambda *a, **k: calls.append((a, k)) or _Fake(), warmup=False,
                          policy=ModelPolicy(trust_remote_code=True), check=None)
    loader.get("org/model", None)
    assert calls[0][1] == {"trust_remote_code": True}
    page = _texts(build_demo(loader, default_presets(str(tmp_path)), []))
    assert any("trust_remote_code is ON" in t for t in page)
    quiet = _texts(build_demo(EngineLoader(INLINE), default_presets(str(tmp_path)), []))
    assert not any("trust_remote_code is ON" in t for t in quiet)
    EngineLoader(INLINE, load=lambda *a, **k: calls.append((a, k)) or _Fake(), warmup=False,
                 check=None).get("org/model", None)
    assert calls[1][1] == {}  # MirrorEngine.load's default: trust_remote_code=False


def test_a_space_loads_only_the_presets_and_allowlisted_ids(tmp_path):
    presets = [PairPreset("embedded", str(tmp_path / "target"), str(tmp_path / "draft"))]
    env = {"SPACE_ID": "someone/mirror", "MIRROR_MODEL_ALLOWLIST": "Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B"}
    policy = ModelPolicy.from_env(env, presets)
    assert policy.in_space and policy.allowlist == {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"}
    policy.check(str(tmp_path / "target"))            # presets: chosen by whoever started the app
    policy.check("Qwen/Qwen3-1.7B")
    for local in ("/etc", "./assets", "../x", "~/models", str(tmp_path), "a/b/c"):
        with pytest.raises(MirrorError, match="local paths are refused"):
            policy.check(local)
    with pytest.raises(MirrorError, match="not on this server's allowlist"):
        policy.check("gpt2")
    only_presets = ModelPolicy.from_env({"SPACE_ID": "someone/mirror"}, presets)
    with pytest.raises(MirrorError, match="allowlist .*none"):
        only_presets.check("Qwen/Qwen3-0.6B")
    anywhere = ModelPolicy.from_env({}, presets)       # a local run: any id or folder
    anywhere.check("gpt2")
    anywhere.check(str(tmp_path))


def test_the_page_refuses_a_disallowed_model_before_loading_anything(pair_root, tmp_path):
    from ui.session import Session
    from ui.settings import settings_from_ui
    from ui.streaming import run_comparison

    target, draft = build_pair(pair_root, "llama")
    presets = default_presets(str(tmp_path), target, draft)
    loaded = []
    loader = EngineLoader(INLINE, load=lambda *a, **k: loaded.append(a) or _Fake(), warmup=False,
                          policy=ModelPolicy.from_env({"SPACE_ID": "x/y", "MIRROR_MODEL_ALLOWLIST": "org/ok"}, presets))
    page = _texts(build_demo(loader, presets, []))
    assert any("`org/ok`" in t and "local paths are refused" in t for t in page)
    for source, needle in ((str(tmp_path), "local paths are refused"), ("org/other", "allowlist")):
        session = Session()
        settings = settings_from_ui(page_values(prompt="1, 2", target=source, decoders=["ar"], gamma=3, kappa=2,
                                                max_new_tokens=8))
        list(run_comparison(loader, session, settings))
        assert session.status.startswith("**Error:**") and needle in session.status
    assert loaded == []


def test_request_sizes_are_bounded_on_the_page(tmp_path):
    from mirror_core.config import MAX_GAMMA, MAX_KAPPA, MAX_PROMPT_CHARS
    from ui.settings import APP_MAX_NEW_TOKENS, settings_from_ui

    demo = build_demo(EngineLoader(INLINE), default_presets(str(tmp_path)), [])
    config = demo.get_config_file()
    props = {c.get("props", {}).get("elem_id"): c["props"] for c in config["components"]}
    assert props["mirror-prompt"]["max_length"] == MAX_PROMPT_CHARS
    sliders = {c["props"].get("label") for c in config["components"] if c.get("type") == "slider"
               and not str(c["props"].get("elem_id")).startswith(("mirror-whatif-", "mirror-player-"))}  # the Learn
    # tab's model knobs and its step player's phase (1..6, nothing typed)
    assert sliders == {"Step"}  # only the inspector's; Run's knobs are number boxes (a slider clamps typed values)
    for name, value, needle in (("max_new_tokens", APP_MAX_NEW_TOKENS + 1, f"max new tokens must be in 1..{APP_MAX_NEW_TOKENS}"),
                                ("gamma", 999, f"γ (gamma) must be in 0..{MAX_GAMMA} on this page, got 999"),
                                ("kappa", MAX_KAPPA + 1, f"κ (kappa) must be in 0..{MAX_KAPPA}"),
                                ("temperature", 5, "temperature must be in 0.0..2.0")):
        with pytest.raises(MirrorError, match=re.escape(needle)):
            settings_from_ui(page_values(prompt="1", target="t", **{name: value}))
    assert demo._queue.max_size is not None


class _Fake:
    """Stands in for a loaded engine where only the loader's policy is under test."""

    def close(self):
        pass


def _texts(demo) -> list[str]:
    return [b.value for b in demo.blocks.values() if isinstance(getattr(b, "value", None), str)]
