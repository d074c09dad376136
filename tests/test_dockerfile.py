"""The Dockerfile against the repository (scripts/dockerfile_check.py), without Docker: its instructions, and what the
image installs against what the code imports (the slow tier). Its build and start in a fresh virtual environment
(`python scripts/dockerfile_check.py --slow`: a package index, 3 GB, about 3 minutes) is left to a person."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

pytestmark = pytest.mark.slow  # the Dockerfile check (the slow tier)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("dockerfile_check", os.path.join(ROOT, "scripts", "dockerfile_check.py"))
check = sys.modules["dockerfile_check"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(check)


def test_the_dockerfile_agrees_with_the_repository():
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as f:
        df = check.parse_dockerfile(f.read())
    assert df.python_version == check.readme_python_version(os.path.join(ROOT, "README.md")) == "3.11"
    assert df.workdir == "/app" and df.env["MIRROR_SD_CACHE"].startswith("/app/")  # prepared into the image
    assert not df.unknown and check.image_problems() == []  # requirements copied and installed, then code, model
    assert df.expose == (check.served_port(df),) == (7860,)
    assert check.run_args(df) == ["--host", "0.0.0.0"]
    assert check.fast_problems() == []


def test_the_check_names_each_mismatch(tmp_path):
    (tmp_path / "README.md").write_text('---\ntitle: x\npython_version: "3.12"\n---\n# x\n', encoding="utf-8")
    (tmp_path / ".venv").mkdir()
    (tmp_path / "Dockerfile").write_text(
        "FROM python:3.11-slim\nENV A=1 \\\n    B=2\nWORKDIR /app\nCOPY requirements.txt .\n"
        "RUN pip install -r requirements.txt\nEXPOSE 8080\nCMD [\"python\", \"app.py\", \"--no-such-flag\"]\n",
        encoding="utf-8")
    problems = check.fast_problems(str(tmp_path))
    assert problems[0] == "base image python:3.11-slim has Python 3.11, the README's python_version is 3.12"
    assert "COPY source requirements.txt does not exist" in problems
    assert "COPY . . would send .venv into the image: .dockerignore must leave it out" in problems
    assert any(p.startswith("app.parse_args refuses the CMD's arguments") for p in problems)
    (tmp_path / "Dockerfile").write_text("FROM python:3.12\nEXPOSE 8080\nCMD [\"python\", \"app.py\"]\n",
                                         encoding="utf-8")
    (tmp_path / ".dockerignore").write_text(".venv\n", encoding="utf-8")
    assert check.fast_problems(str(tmp_path)) == ["EXPOSE 8080 but the CMD serves on port 7860"]


def test_dockerignore_follows_dockers_matching():
    patterns = check.dockerignore(ROOT)
    for path, out in ((".venv/bin/python", True), (".git/HEAD", True), ("ui/__pycache__/a.pyc", True),
                      ("docs/bench/x/y/bench.html", True), ("app.py", False), ("assets/default_pair/target", False),
                      ("docs/bench/README.md", False), ("assets/default_pair/target/model.gguf", False),
                      ("assets/default_pair/target/model.gguf.index.json", True)):
        assert check.ignored(path, patterns) is out, path
    assert check.ignored("keep.txt", ["*.txt", "!keep.txt"]) is False and check.ignored("a/b.txt", ["*.txt"]) is False


def test_the_image_check_names_what_it_would_miss(tmp_path):
    """Steps out of order, a model the registry does not know, a module imported at run time that no requirement
    installs: each one line."""
    (tmp_path / "requirements.txt").write_text("numpy>=1.26  # arrays\n", encoding="utf-8")
    (tmp_path / "app.py").write_text("import os\nimport numpy\nimport psutil\nfrom mirror_core import x\n",
                                     encoding="utf-8")
    (tmp_path / "Dockerfile").write_text(
        "FROM python:3.11-slim\nWORKDIR /app\nCOPY . .\nCOPY requirements.txt .\nRUN pip install -r requirements.txt\n"
        "RUN python -m mirror_core prepare no-such-model\nCMD [\"python\", \"app.py\"]\n", encoding="utf-8")
    problems = check.image_problems(str(tmp_path))
    assert "COPY . . comes after RUN pip install -r requirements.txt" not in problems
    assert "RUN pip install -r requirements.txt comes after COPY . ." in problems
    assert any(p.startswith("RUN prepares 'no-such-model'") for p in problems)
    assert problems[-1] == "app.py imports psutil, which no distribution requirements.txt installs provides"
    assert len(problems) == 3, problems
