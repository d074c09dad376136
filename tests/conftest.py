"""pytest fixtures: tiny model pairs built from configs (testing/toy_models.py), saved to a session temp dir."""
from __future__ import annotations

import pytest

from testing.toy_models import ARCHS, build_pair


@pytest.fixture(scope="session")
def pair_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("pairs"))


@pytest.fixture(scope="session")
def pairs(pair_root) -> dict[str, tuple[str, str]]:
    return {arch: build_pair(pair_root, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def llama_with_drafts(tmp_path_factory) -> tuple[str, str, str]:
    """A 4-layer Llama target with its token draft and a feature-reading draft of layer 2 (training it takes most of
    a minute: one copy for every test module that needs it)."""
    import os

    from testing.toy_models import feature_draft

    root = str(tmp_path_factory.mktemp("llama_with_drafts"))
    target, draft = build_pair(root, "llama", target_layers=4)
    return target, draft, feature_draft(target, os.path.join(root, "fdraft"), layer=2, steps=40)


@pytest.fixture(scope="session", autouse=True)
def calibration_cache(tmp_path_factory):
    """Dtype calibrations (runners/calibrate.py) go to a folder of this session, not the user's cache
    (the environment variable reaches the draft lanes' spawned processes too)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIRROR_SD_CACHE", str(tmp_path_factory.mktemp("mirror_sd_cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def temp_files(tmp_path_factory):
    """Temporary files (the UI's trace downloads, Gradio's cache) go to a folder of this session that pytest prunes:
    a test's server stops without closing its sessions, so their traces would otherwise stay in /tmp."""
    import tempfile

    folder = str(tmp_path_factory.mktemp("tmp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", folder)
        mp.setenv("TMPDIR", folder)
        yield
