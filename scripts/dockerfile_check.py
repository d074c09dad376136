"""Does the Dockerfile build and start? Its instructions checked against the repository, then (with --slow) its
install and start commands run here, without Docker, in a fresh virtual environment.

    python scripts/dockerfile_check.py [--slow] [--keep]

The fast checks: the base image's Python is the README's `python_version` (the Space card); every COPY source
exists; what COPY sends leaves out the local virtual environment and git metadata (.dockerignore); the EXPOSE
port is the port the CMD serves on; `app.parse_args` accepts the CMD's arguments. Then what the image installs
(`image_problems`): requirements.txt is copied and installed with pip before the code is copied and the model
prepared; every module app.py, ui/ and mirror_core/ import at run time comes with a distribution requirements.txt
names or one of theirs depends on (read from this environment's installed metadata); each `python -m mirror_core
prepare NAME` names a model of the registry. The tests run these (tests/test_dockerfile.py, the slow tier).

--slow plays the build and the start: the WORKDIR becomes a temporary folder, each COPY copies into it (what
.dockerignore leaves out stays out), each RUN runs there in a fresh `python -m venv` with the Dockerfile's ENV
(paths under the WORKDIR moved into the folder, so MIRROR_SD_CACHE is a fresh cache and `prepare` fetches and
converts the model as the image build does), then the CMD starts and the page must answer 200 within
START_TIMEOUT_S. Nothing is reused from this checkout's virtual environment or the user's cache. It needs a
package index (pip) and about 3 GB of disk.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT_S = 240
sys.path[:0] = [ROOT]  # testing.net (the free port), app, mirror_core
RUN_TIMEOUT_S = 1800  # one RUN line (pip install of the requirements is the longest)


@dataclass(frozen=True)
class Dockerfile:
    """The instructions this repository's Dockerfile uses, in order (continuation lines joined)."""

    base: str                                   # FROM
    env: dict[str, str]                         # ENV, all of them
    workdir: str                                # WORKDIR (the last one)
    steps: tuple[tuple[str, str], ...]          # ("COPY", "src dest") and ("RUN", "command"), in order
    expose: tuple[int, ...]
    cmd: tuple[str, ...]                        # CMD, exec form
    unknown: tuple[str, ...] = field(default=())  # instructions this check does not know

    @property
    def python_version(self) -> str | None:
        """'3.11' for python:3.11-slim (None for a base that is not the official python image)."""
        m = re.match(r"^(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)", self.base)
        return m.group(1) if m else None

    def copies(self) -> list[tuple[list[str], str]]:
        out = []
        for kind, arg in self.steps:
            if kind == "COPY":
                parts = shlex.split(arg)
                out.append((parts[:-1], parts[-1]))
        return out


def parse_dockerfile(text: str) -> Dockerfile:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    base, workdir, env, steps, expose, cmd, unknown = "", "/", {}, [], [], (), []
    for line in lines:
        word, _, arg = line.partition(" ")
        word, arg = word.upper(), arg.strip()
        if word == "FROM":
            base = arg.split()[0]
        elif word == "ENV":
            env.update(_env_pairs(arg))
        elif word == "WORKDIR":
            workdir = arg
        elif word in ("COPY", "RUN"):
            steps.append((word, arg))
        elif word == "EXPOSE":
            expose += [int(p.split("/")[0]) for p in arg.split()]
        elif word == "CMD":
            cmd = tuple(json.loads(arg)) if arg.startswith("[") else ("/bin/sh", "-c", arg)
        else:
            unknown.append(word)
    return Dockerfile(base, env, workdir, tuple(steps), tuple(expose), cmd, tuple(unknown))


def _env_pairs(arg: str) -> dict[str, str]:
    parts = shlex.split(arg)
    if parts and "=" not in parts[0]:  # the legacy form: ENV KEY value with spaces
        return {parts[0]: arg.split(None, 1)[1] if len(parts) > 1 else ""}
    return dict(p.split("=", 1) for p in parts)


def readme_python_version(path: str) -> str | None:
    """python_version from the README's front matter (the Space card), without quotes."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.match(r"^---\n(.*?)\n---", text, re.S)
    if not m:
        return None
    v = re.search(r"^python_version:\s*[\"']?([^\"'\s]+)", m.group(1), re.M)
    return v.group(1) if v else None


def dockerignore(root: str) -> list[str]:
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [ln.strip().rstrip("/") for ln in f if ln.strip() and not ln.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: a pattern (`*`, `?`, `**` for any folders) matches the path or a folder above it, from the
    context's root; the last matching pattern wins and `!` includes again."""
    result = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pat in patterns:
        negate = pat.startswith("!")
        regex = _glob(pat[1:] if negate else pat)
        if any(regex.fullmatch(p) for p in prefixes):
            result = not negate
    return result


def _glob(pattern: str) -> re.Pattern:
    out, i, pattern = "", 0, pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            ch = pattern[i]
            out, i = out + {"*": "[^/]*", "?": "[^/]"}.get(ch, re.escape(ch)), i + 1
    return re.compile(out)


def run_args(df: Dockerfile) -> list[str]:
    """The CMD's arguments after `python app.py` (what app.parse_args receives)."""
    cmd = list(df.cmd)
    if len(cmd) < 2 or os.path.basename(cmd[0]) not in ("python", "python3") or cmd[1] != "app.py":
        raise ValueError(f"CMD is not `python app.py ...`: {cmd}")
    return cmd[2:]


def served_port(df: Dockerfile) -> int:
    """The port the CMD serves on: its --port, else the app's default under the Dockerfile's ENV."""
    import app

    saved = {k: os.environ.get(k) for k in ("GRADIO_SERVER_PORT", "GRADIO_SERVER_NAME")}
    try:
        for k in saved:
            if k in df.env:
                os.environ[k] = df.env[k]
            else:
                os.environ.pop(k, None)
        return app.parse_args(run_args(df)).port
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fast_problems(root: str = ROOT) -> list[str]:
    """Every mismatch between the Dockerfile and the repository, one line each (empty: none)."""
    with open(os.path.join(root, "Dockerfile"), encoding="utf-8") as f:
        df = parse_dockerfile(f.read())
    problems = []
    if df.unknown:
        problems.append(f"instructions this check does not know: {', '.join(df.unknown)}")
    readme = readme_python_version(os.path.join(root, "README.md"))
    if df.python_version is None or df.python_version != readme:
        problems.append(f"base image {df.base} has Python {df.python_version}, the README's python_version is {readme}")
    for sources, _ in df.copies():
        problems += [f"COPY source {s} does not exist" for s in sources if not os.path.exists(os.path.join(root, s))]
    patterns = dockerignore(root)
    for must in (".venv", ".git"):
        if os.path.exists(os.path.join(root, must)) and not ignored(must, patterns):
            problems.append(f"COPY . . would send {must} into the image: .dockerignore must leave it out")
    try:
        port = served_port(df)
        if tuple(df.expose) != (port,):
            problems.append(f"EXPOSE {' '.join(map(str, df.expose))} but the CMD serves on port {port}")
    except SystemExit:
        problems.append(f"app.parse_args refuses the CMD's arguments: {df.cmd}")
    except ValueError as exc:
        problems.append(str(exc))
    return problems


# -- what the image installs ---------------------------------------------------------------------------
OPTIONAL_REQUIREMENTS = "requirements-zerogpu.txt"  # a ZeroGPU Space's extras (`spaces`: imported there only)
# modules the code imports only when a user asks for them, saying how to install them when missing
OPTIONAL_MODULES = {"llama_cpp": "the bench's llama.cpp peer (mirror_core/bench/peers.py: LLAMA_CPP_HINT)"}


def image_problems(root: str = ROOT) -> list[str]:
    """What the image installs and prepares, against the code it runs (one line per mismatch; empty: none)."""
    with open(os.path.join(root, "Dockerfile"), encoding="utf-8") as f:
        df = parse_dockerfile(f.read())
    return _step_order_problems(df) + _prepare_problems(df) + import_problems(root)


def _step_order_problems(df: Dockerfile) -> list[str]:
    """requirements.txt copied, then installed with pip, then the code copied, then the model prepared."""
    def first(match) -> int | None:
        return next((i for i, step in enumerate(df.steps) if match(*step)), None)

    order = [("COPY of requirements.txt", first(lambda k, a: k == "COPY" and "requirements.txt" in shlex.split(a)[:-1])),
             ("RUN pip install -r requirements.txt",
              first(lambda k, a: k == "RUN" and re.search(r"pip install (.* )?-r requirements\.txt", a) is not None)),
             ("COPY . .", first(lambda k, a: k == "COPY" and shlex.split(a) == [".", "."])),
             ("RUN python -m mirror_core prepare", first(lambda k, a: k == "RUN" and "mirror_core prepare" in a))]
    problems = [f"no {name} step" for name, at in order if at is None]
    found = [(name, at) for name, at in order if at is not None]
    problems += [f"{a} comes after {b}" for (a, i), (b, j) in zip(found, found[1:]) if i > j]
    return problems


def _prepare_problems(df: Dockerfile) -> list[str]:
    from mirror_core.models.prepared import REGISTRY

    names = [m.group(1) for kind, arg in df.steps if kind == "RUN"
             for m in re.finditer(r"python -m mirror_core prepare\s+(\S+)", arg)]
    return [f"RUN prepares {name!r}, which the registry does not know ({', '.join(REGISTRY)})"
            for name in names if name not in REGISTRY]


def import_problems(root: str = ROOT) -> list[str]:
    """Every third-party module imported at run time (app.py, ui/, mirror_core/; not the offline training/) must come
    with a distribution requirements.txt names, or one they depend on; modules of OPTIONAL_REQUIREMENTS' extras only
    are left to that file, and OPTIONAL_MODULES to the user who asks for them."""
    from importlib.metadata import packages_distributions

    wanted = _requirement_names(os.path.join(root, "requirements.txt"))
    closure = _closure(wanted)
    optional = _requirement_names(os.path.join(root, OPTIONAL_REQUIREMENTS)) - wanted
    providers = packages_distributions()
    problems = []
    for module, where in sorted(runtime_imports(root).items()):
        dists = {_norm(d) for d in providers.get(module, ())}
        if (not dists and _norm(module) in optional) or module in OPTIONAL_MODULES:
            continue
        if not dists & closure:
            problems.append(f"{where} imports {module}, which no distribution requirements.txt installs provides")
    return problems


def runtime_imports(root: str) -> dict[str, str]:
    """Third-party top-level module → the first file importing it, over app.py, ui/ and mirror_core/."""
    import ast

    files = ["app.py"] + sorted(os.path.relpath(os.path.join(d, f), root) for top in ("ui", "mirror_core")
                                for d, _, fs in os.walk(os.path.join(root, top)) for f in fs if f.endswith(".py"))
    local = {"app", "ui", "mirror_core", "__future__"}
    out: dict[str, str] = {}
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for top in (n.split(".")[0] for n in names):
                if top not in local and top not in sys.stdlib_module_names:
                    out.setdefault(top, rel)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(path: str) -> set[str]:
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        lines = [line.split("#")[0].strip() for line in f]
    return {_norm(re.split(r"[\s<>=!~;\[]", line)[0]) for line in lines if line and not line.startswith("-")}


def _closure(names: set[str]) -> set[str]:
    """The distributions `names` install: themselves and what their metadata requires (extras left out)."""
    from importlib.metadata import PackageNotFoundError, requires

    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [_norm(re.split(r"[\s<>=!~;\[(]", r)[0]) for r in needs if "extra ==" not in r]
    return seen


# -- the slow part: build and start without Docker ----------------------------------------------------------
def _log(line: str) -> None:
    print(line, flush=True)


def copy_into(root: str, sources: list[str], dest: str, patterns: list[str]) -> None:
    """COPY sources dest, relative to the build context `root`, leaving out what .dockerignore names."""
    os.makedirs(dest, exist_ok=True)
    for src in sources:
        path = os.path.join(root, src)
        if os.path.isfile(path):
            shutil.copy2(path, dest)
            continue
        for folder, dirs, files in os.walk(path):
            rel_folder = os.path.relpath(folder, root)
            rel_folder = "" if rel_folder == "." else rel_folder
            dirs[:] = [d for d in dirs if not ignored(os.path.join(rel_folder, d).lstrip("/"), patterns)]
            for name in files:
                rel = os.path.join(rel_folder, name).lstrip("/")
                if ignored(rel, patterns):
                    continue
                target = os.path.join(dest, os.path.relpath(os.path.join(folder, name), path))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(os.path.join(folder, name), target, follow_symlinks=False)


def slow_check(root: str = ROOT, keep: bool = False, start_timeout_s: float = START_TIMEOUT_S) -> dict[str, float]:
    """Build (COPY, RUN in a fresh venv) and start (CMD, until the page answers 200); the seconds of each phase.
    Raises RuntimeError with one line on the first failure."""
    with open(os.path.join(root, "Dockerfile"), encoding="utf-8") as f:
        df = parse_dockerfile(f.read())
    tmp = tempfile.mkdtemp(prefix="mirror-sd-dockerfile-")
    work = os.path.join(tmp, df.workdir.strip("/") or "app")
    times: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        env = _fresh_venv(tmp, df, work)
        times["venv"] = time.perf_counter() - t0
        _build(df, root, work, env, times)
        _start(df, work, env, os.path.join(tmp, "cmd.log"), start_timeout_s, times)
        return times
    finally:
        if keep:
            _log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _fresh_venv(tmp: str, df: Dockerfile, work: str) -> dict[str, str]:
    """A clean virtual environment in tmp (the image's interpreter: no site packages of this checkout), and the
    environment the build and the CMD run in: this one's without Python, cache and hub settings, the venv first on
    PATH, then the Dockerfile's ENV with paths under its WORKDIR moved into `work`."""
    venv = os.path.join(tmp, "venv")
    subprocess.run([_base_python(), "-m", "venv", venv], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
           and not k.startswith(("MIRROR_SD_", "GRADIO_", "HF_"))}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = venv
    env.update({k: v.replace(df.workdir, work) for k, v in df.env.items()})
    return env


def _build(df: Dockerfile, root: str, work: str, env: dict[str, str], times: dict[str, float]) -> None:
    """Each COPY (what .dockerignore leaves out stays out) and RUN in order, timed into `times`."""
    patterns = dockerignore(root)
    for i, (kind, arg) in enumerate(df.steps):
        t = time.perf_counter()
        if kind == "COPY":
            sources, dest = df.copies()[sum(1 for k, _ in df.steps[:i] if k == "COPY")]
            copy_into(root, sources, os.path.normpath(os.path.join(work, dest)), patterns)
        else:
            _log(f"RUN {arg}")
            done = subprocess.run(["/bin/sh", "-c", arg], cwd=work, env=env, timeout=RUN_TIMEOUT_S,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"RUN {arg} failed ({done.returncode}): {' | '.join(tail)}")
        label = f"{kind} {arg}"
        times[label] = time.perf_counter() - t
        _log(f"  {label}: {times[label]:.0f} s")


def _start(df: Dockerfile, work: str, env: dict[str, str], log_path: str, start_timeout_s: float,
           times: dict[str, float]) -> None:
    """The CMD, on the EXPOSE port (another one when it is taken here), until the page answers; stopped after."""
    from testing.net import free_port

    port = df.expose[0] if df.expose else 7860
    if free_port(port, "0.0.0.0") != port:
        port = free_port(0, "0.0.0.0")
        _log(f"port {df.expose[0]} is taken on this machine: serving on {port} (GRADIO_SERVER_PORT)")
        env["GRADIO_SERVER_PORT"] = str(port)
    t = time.perf_counter()
    _log(f"CMD {' '.join(df.cmd)}")
    log = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(list(df.cmd), cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        status = _poll(f"http://127.0.0.1:{port}/", proc, start_timeout_s)
        times["CMD until the page answers"] = time.perf_counter() - t
        if status != 200:
            with open(log_path, encoding="utf-8") as f:
                tail = f.read().strip().splitlines()[-3:]
            raise RuntimeError(f"the page did not answer 200 within {start_timeout_s:.0f} s (last: {status}; "
                               f"exit code {proc.poll()}): {' | '.join(tail)}")
        _log(f"  the page answered 200 after {times['CMD until the page answers']:.0f} s")
    finally:
        _stop(proc)
        log.close()


def _base_python() -> str:
    """This interpreter's base (outside any virtual environment)."""
    return os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")


def _poll(url: str, proc: subprocess.Popen, timeout_s: float):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited ({proc.returncode})"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.status
        except urllib.error.HTTPError as exc:
            last = exc.code
        except (urllib.error.URLError, OSError) as exc:
            last = type(exc).__name__
        time.sleep(1.0)
    return last


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the app shuts down like Ctrl-C, as `docker stop` asks), then SIGKILL for the whole group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the draft lane's process, if the app left it
    except ProcessLookupError:
        pass
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slow", action="store_true", help="also install and start, in a fresh virtual environment")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (its cmd.log: the server's output)")
    args = p.parse_args(argv)
    problems = fast_problems() + image_problems()
    for line in problems:
        print(f"problem: {line}")
    if problems:
        return 1
    print("Dockerfile: FROM, ENV, WORKDIR, COPY, RUN, EXPOSE and CMD agree with the repository, and the image installs "
          "what the code imports")
    if args.slow:
        t = time.perf_counter()
        try:
            slow_check(keep=args.keep)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            print(f"problem: {exc}")
            return 1
        print(f"Dockerfile: built and started without Docker in {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
