"""The ownership rules of docs/ARCHITECTURE.md, checked on the source: who may import whom, and no import circles."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "mirror_core")


def _modules(package: str = PACKAGE) -> dict[str, str]:
    """Module name (mirror_core.x.y) → file path, for every module of a package (the engine's by default)."""
    out = {}
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(folder, name)
    return out


MODULES = _modules()
UI_MODULES = _modules(os.path.join(ROOT, "ui"))
TRAINING_MODULES = _modules(os.path.join(ROOT, "training"))
APP = {"app": os.path.join(ROOT, "app.py")}
RUNTIME_MODULES = {**MODULES, **UI_MODULES, **APP}  # what `python app.py` and `python -m mirror_core` may import
EVERY_MODULE = {**RUNTIME_MODULES, **TRAINING_MODULES}


def _imports(module: str, top_level_only: bool, type_only: bool = False) -> set[str]:
    """Absolute names this module imports (relative imports resolved; `from X import Y` → X.Y when Y is a module);
    with type_only, the imports under `if TYPE_CHECKING:` too."""
    path = EVERY_MODULE[module]
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree) if type_only else _walk_runtime(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in EVERY_MODULE}
            out |= submodules if submodules else {base}
    return out


def _walk_runtime(node: ast.AST):
    """ast.walk, skipping `if TYPE_CHECKING:` blocks (annotations only, never run)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
            continue
        yield from _walk_runtime(child)


def _importers_of(prefix: str, top_level_only: bool = False) -> set[str]:
    return {m for m in MODULES if any(i == prefix or i.startswith(prefix + ".") for i in _imports(m, top_level_only))}


def test_the_engine_imports_no_ui_and_plotly_only_in_the_html_report():
    assert _importers_of("gradio") == set() and _importers_of("ui") == set()
    assert _importers_of("plotly") <= {"mirror_core.bench.html_report"}


def test_models_say_where_weights_come_from_and_decide_nothing():
    """models/ (weights, tokenizers, pairs, the model maths, the architecture table) imports no decoding, lane,
    engine, runner or UI code: runners/ → models/, one way; plotly waits for an HTML report (no module imports
    html_report at its top level)."""
    for module in (m for m in MODULES if m.startswith("mirror_core.models")):
        imported = _imports(module, top_level_only=False, type_only=True)
        assert not any(i.startswith(d) for i in imported for d in (
            "mirror_core.decode", "mirror_core.draft_worker", "mirror_core.lanes", "mirror_core.planner",
            "mirror_core.engine", "mirror_core.pair", "mirror_core.verify", "mirror_core.runners", "ui")), module
    assert _importers_of("mirror_core.bench.html_report", top_level_only=True) == set()


def test_config_reads_no_environment_and_imports_no_torch():
    assert not {"torch", "os"} & _imports("mirror_core.config", top_level_only=False)


def test_load_time_records_stand_on_the_ground_floor():
    """records.py (row bands and checks, calibrations, the whole-machine timing, the exit head's description) imports
    no torch and no other module of the engine; events.py imports nothing from runners/ (type-only imports too)."""
    assert _imports("mirror_core.records", top_level_only=False, type_only=True) <= {"__future__", "json", "dataclasses"}
    assert not {i for i in _imports("mirror_core.events", top_level_only=False, type_only=True)
                if i.startswith("mirror_core.runners")}


def test_native_code_stands_behind_the_runners():
    """kernels/ (the native kernel and its checked boundary) imports only torch, machine and itself; only runners/
    import the native code (native.py); its tables (formats.py, variants.py: no torch) and BlockWeights may be read
    by the rest of the engine (config derives its choices from them; models/ reads GGUF files into blocks)."""
    for module in (m for m in MODULES if m.startswith("mirror_core.kernels")):
        engine = {i for i in _imports(module, top_level_only=False, type_only=True) if i.startswith("mirror_core")}
        assert all(i == "mirror_core.machine" or i.startswith("mirror_core.kernels") for i in engine), (module, engine)
    importers = {m for m in _importers_of("mirror_core.kernels.native") if not m.startswith("mirror_core.kernels")}
    assert importers and all(m.startswith("mirror_core.runners") for m in importers), importers
    for table in ("mirror_core.kernels.formats", "mirror_core.kernels.variants"):
        assert not {"torch", "os"} & _imports(table, top_level_only=False)


def test_the_environment_is_read_at_the_edges_only():
    """os.environ / os.getenv: cli.py, MirrorEngine.load (the fault hook) and machine.py (the cache folder) in the
    engine; nowhere in ui/ (app.py passes os.environ in)."""
    def reads_environment(module: str) -> bool:
        tree = ast.parse(open(EVERY_MODULE[module], encoding="utf-8").read())
        return any(isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") and getattr(n.value, "id", "") == "os"
                   for n in ast.walk(tree))

    readers = {m for m in {**MODULES, **UI_MODULES} if reads_environment(m)}
    assert readers == {"mirror_core.cli", "mirror_core.engine", "mirror_core.machine"}, readers


def test_pure_maths_and_lanes_keep_to_their_rooms():
    for pure in ("mirror_core.verify", "mirror_core.sampling", "mirror_core.latency", "mirror_core.metrics"):
        imported = _imports(pure, top_level_only=False)
        assert not any(i.startswith(("mirror_core.runners", "mirror_core.lanes", "mirror_core.decode",
                                     "mirror_core.draft_worker")) for i in imported), pure
    for lane_module in (m for m in MODULES if m.startswith("mirror_core.lanes")):
        imported = _imports(lane_module, top_level_only=False)
        assert not any(i.startswith(d) for i in imported
                       for d in ("mirror_core.decode", "mirror_core.planner", "mirror_core.verify")), lane_module


def test_the_bench_uses_the_public_surface_only():
    allowed = ("mirror_core.bench", "mirror_core.config", "mirror_core.engine", "mirror_core.events",
               "mirror_core.latency", "mirror_core.metrics", "mirror_core.phases", "mirror_core.models.loading",
               "mirror_core.lanes.placement",
               "mirror_core.machine",  # this machine's facts and devices are public
               "mirror_core.models.prepared")  # where a prepared registry model keeps its GGUF (the llama.cpp peer)
    for module in (m for m in MODULES if m.startswith("mirror_core.bench")):
        inner = {i for i in _imports(module, top_level_only=False) if i.startswith("mirror_core")}
        assert all(i == a or i.startswith(a + ".") for i in inner for a in allowed if i.startswith(a)), module
        assert all(any(i == a or i.startswith(a + ".") for a in allowed) for i in inner), (module, inner)


def test_training_and_test_helpers_are_never_imported_at_run_time():
    """The lab wing (training/) and the test helpers (testing/) stand outside what runs: no module of mirror_core/,
    ui/ or app.py imports either (lazy imports included), and mirror_core/ holds no training code."""
    importers = {prefix: {m for m in RUNTIME_MODULES if any(i == prefix or i.startswith(prefix + ".")
                                                            for i in _imports(m, top_level_only=False, type_only=True))}
                 for prefix in ("training", "testing")}
    assert importers == {"training": set(), "testing": set()}, importers
    assert TRAINING_MODULES and not any(m.startswith("mirror_core.train") for m in MODULES)


def test_no_import_circles_between_modules():
    """Imports of the engine, the UI and the training wing (lazy and type-only ones included) form no circle; a
    package's __init__ importing its own modules is not one."""
    graph = {m: {i for i in _imports(m, top_level_only=False, type_only=True) if i in EVERY_MODULE and i != m}
             for m in EVERY_MODULE}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " → ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_ui_reaches_the_engine_through_its_public_surface():
    """ui/ imports the engine's API (MirrorEngine.stream, the configs, the event types) and the read-only rooms beside
    it: the latency model, the metrics, a step's phases, this machine, models/ (what the pairs are, tokenizers, text streams), the
    lane plan; never a loop, a lane's workings, a runner or a worker."""
    allowed = {"mirror_core", "mirror_core.config", "mirror_core.engine", "mirror_core.events", "mirror_core.latency",
               "mirror_core.metrics", "mirror_core.phases", "mirror_core.machine", "mirror_core.lanes.placement"}
    for module in UI_MODULES:
        inner = {i for i in _imports(module, top_level_only=False, type_only=True) if i.startswith("mirror_core")}
        outside = {i for i in inner - allowed if not i.startswith("mirror_core.models.")}
        assert not outside, (module, outside)


# The runner calls that move a cache's positions (runners/protocol.py).
CACHE_MOVES = {"forward", "forward_to_exit", "finish_pass", "forward_streams", "truncate", "fork", "forward_rows",
               "rewind_rows", "select_row"}


def _cache_moves(module: str) -> set[str]:
    tree = ast.parse(open(EVERY_MODULE[module], encoding="utf-8").read())
    return {node.func.attr for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CACHE_MOVES}


def test_only_the_two_lanes_loops_move_cache_positions():
    """The target's cache moves only in the target lane's loop (decode.py over DecodeState) and the draft's only in
    DraftWorker (and FeatureDraftWorker, draft_feature.py); outside them only runners/ (on caches of their own:
    calibration, the row check) and training call a runner; verify.py and sampling.py call no model."""
    movers = {m for m in MODULES if not m.startswith("mirror_core.runners") and _cache_moves(m)}
    assert movers == {"mirror_core.decode", "mirror_core.decode_state", "mirror_core.draft_worker",
                      "mirror_core.draft_feature"}, movers
    assert not {m for m in UI_MODULES if _cache_moves(m)}  # ui/ never calls a runner


def test_a_runner_is_read_by_what_it_declares_never_probed():
    """What a runner can do is declared by runners/protocol.py (its kernel, formats, weight stream, row plan, readout)
    and read as declared: no getattr/hasattr by name over a runner in the engine or the page, and no packed map set
    as an attribute on a model object (it is passed into the forward)."""
    probes, installed = [], []
    for module, path in {**MODULES, **UI_MODULES}.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and ast.unparse(node.args[0]).lower().endswith(("runner", "target", "inner", "exit_head"))):
                probes.append(f"{module}: {ast.unparse(node)}")
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr in ("packed", "kernel_note")
                                                    and ast.unparse(t.value) != "self" for t in node.targets):
                installed.append(f"{module}: {ast.unparse(node)}")
    assert not probes and not installed, (probes, installed)


def test_configuration_is_frozen_and_stages_hand_over_dataclasses():
    import dataclasses

    from mirror_core import config, events, messages, metrics, records, verify
    from mirror_core.runners.protocol import ExitPass

    for module in (config, records):
        frozen = [c for c in vars(module).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
                  and c.__module__ == module.__name__]
        assert frozen and all(c.__dataclass_params__.frozen for c in frozen), frozen
    for handed in (messages.ExitReadout, verify.AcceptResult, messages.DraftWindow, events.StepRecord,
                   metrics.RunSummary, ExitPass):
        assert dataclasses.is_dataclass(handed), handed


# Orchestrators read as named phases: no function longer than this many lines (ast: end_lineno − lineno + 1).
MAX_LINES = 60
MAX_TRAINING_MODULE_LINES = 400  # a training module holds one stage of a recipe: read top to bottom in one sitting


def test_no_function_is_longer_than_a_screen():
    """No function of mirror_core/, ui/, app.py or training/ is longer than MAX_LINES."""
    long = []
    for module, path in EVERY_MODULE.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_LINES:
                long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines (at most {MAX_LINES})")
    assert not long, long


def test_training_modules_are_one_stage_each():
    long = {m: n for m, path in TRAINING_MODULES.items()
            if (n := len(open(path, encoding="utf-8").readlines())) > MAX_TRAINING_MODULE_LINES}
    assert not long, long
