"""UI values → engine configs, in one place (`settings_from_ui`), plus the controls' names, defaults, bounds, help."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mirror_core import MirrorError, Request, SamplingConfig, SpecConfig
from mirror_core.config import (
    ContextConfig,
    AUTO_BRANCH_BUDGET,
    DTYPE_CHOICES,
    DEFAULT_GAMMA,
    DEFAULT_KAPPA,
    MAX_GAMMA,
    MAX_KAPPA,
    MAX_NEW_TOKENS_CAP,
    check_prompt_text,
)

# Decoder keys in the order they run (baseline first) and the names the page shows.
DECODER_ORDER = ("ar", "mirror", "sd")  # the order they run in, and left to right on the page
DECODER_TITLES = {"ar": "Target-only AR (baseline)", "sd": "Vanilla SD", "mirror": "Mirror-SD"}
RULE_CHOICES = (("exact: Rule E, reproduces AR token for token with the same seed", "exact"),
                ("rejection: Rule R, Leviathan/Chen rejection sampling", "rejection"))

APP_MAX_NEW_TOKENS = min(1024, MAX_NEW_TOKENS_CAP)  # the page's cap per decoder, checked server-side
APP_MAX_TEMPERATURE = 2.0                           # the highest temperature the page takes
MIN_TOP_P = 0.01                                    # the lowest top-p the page takes (top-p must be > 0)
MAX_REPEATS = 5                                     # comparisons per Run (median and range over them)
DEFAULT_REPEATS = 3                                 # a first run shows its spread: the verdict reads the middle one


def _signed(n: int) -> str:
    return str(n).replace("-", "−")  # typographic minus, as the page writes it


@dataclass(frozen=True)
class Control:
    """One parameter of the public /run endpoint and its field on the Run tab."""

    name: str
    label: str                   # the field's label
    info: str                    # the one line of help under it
    default: object = None       # None: from the presets and examples (the pair and the prompt)
    bounds: tuple | None = None  # a number's (lowest, highest) on the page; highest None: no bound (the engine checks)
    said: str = ""               # its name in an error line ("" = not a number)
    step: float = 1              # a number's step: 1 = a whole number
    row: str = ""                # the row of "Speculation and sampling" it sits in; "" = the first screen's fields


# The Run controls in the order the public /run endpoint takes them (gradio_client and raw HTTP callers pass them
# positionally, so append new ones at the end). A new control is one entry here (the Run tab builds a number box,
# a checkbox or the rule's radio in its row from it) and its use in settings_from_ui.
RUN_CONTROLS = (
    Control("prompt", "Prompt", "Text for models with a tokenizer; for models without one, comma-separated token ids "
            "(e.g. 1, 2, 3)."),
    Control("target", "Target", "Its own tokens in this Format, reproduced exactly: a Hugging Face id or a folder."),
    Control("draft", "Draft", "Smaller, same vocabulary (e.g. Qwen/Qwen3-0.6B); empty: AR only."),
    Control("decoders", "Decoders to compare", "Run one after another, each with both lanes to itself; AR is the "
            "baseline every speedup refers to; vanilla SD is the paper's comparison (Mirror ÷ SD in the verdict).",
            ["ar", "mirror", "sd"]),
    Control("gamma", "γ (window)", f"γ: draft tokens per window the target verifies in one pass (0..{MAX_GAMMA}); "
            "0 = the value chosen for this machine when the pair loaded (its latency model; "
            f"{DEFAULT_GAMMA} for a draft without a profile).", 0, (0, MAX_GAMMA), "γ (gamma)", row="speculation"),
    Control("kappa", "κ (candidates per slot)", "κ: early-exit candidates per slot sent to the draft lane; the draft "
            f"rolls out a branch for each (0..{MAX_KAPPA}); 0 = chosen like γ ({DEFAULT_KAPPA} without a profile).",
            0, (0, MAX_KAPPA), "κ (kappa)", row="speculation"),
    Control("exit_layer", "ℓ_e (early-exit layer)", "ℓ_e: target layer whose hidden state gives the early-exit top-κ "
            "(1..N−1); 0 = the loaded pair's: the layer its feature-reading draft reads, else its trained exit head's, "
            "else N/2.", 0, (0, None), "exit layer ℓ_e", row="speculation"),
    Control("temperature", "Temperature", "0 = greedy (output equals the target's greedy tokens). Above 0: sampling.",
            0.0, (0.0, APP_MAX_TEMPERATURE), "temperature", 0.05, "sampling"),
    Control("top_k", "Top-k", "Keep only the k most likely tokens before sampling; 0 = off.", 0, (0, None), "top-k",
            row="sampling"),
    Control("top_p", "Top-p", "Nucleus sampling: keep the smallest set of tokens with this much probability; 1 = off.",
            1.0, (MIN_TOP_P, 1.0), "top-p", 0.01, "sampling"),
    Control("rule", "Rule", "Acceptance rule when temperature > 0 (at 0 both are greedy matching).", "exact",
            row="sampling"),
    Control("max_new_tokens", "Max new tokens", "New tokens per decoder (the prompt + this + γ + 2 must fit the "
            "models' context).", 64, (1, APP_MAX_NEW_TOKENS), "max new tokens", row="speculation"),
    Control("seed", "Seed", "Seeds each lane's random generator; same seed + rule exact = the same tokens as AR.", 0,
            (0, None), "seed", row="sampling"),
    Control("branch_budget", "Branch budget", "Branch rows the draft rolls out per step, the likeliest first: 0 = all "
            f"κ(γ+1); {_signed(AUTO_BRANCH_BUDGET)} = auto (as many as it finishes while the target runs its last "
            "layers). Never changes the output.", SpecConfig.branch_budget, (AUTO_BRANCH_BUDGET, None), "branch budget",
            row="speculation"),
    Control("live_plots", "Live plots", "On: when the timing ends, the streams and plots replay the runs the verdict "
            "reads side by side at their measured pace. Off: they appear at once. Either way the page draws nothing "
            "while a decoder is timed (each run shows when it ends), so the browser never competes with the lanes.",
            True, row="sampling"),
    Control("repeats", "Repeats", f"Run the whole comparison this many times (1..{MAX_REPEATS}); the numbers show each "
            "metric's median and range, and every other repeat runs the decoders in reverse order so none always goes "
            "first.", DEFAULT_REPEATS, (1, MAX_REPEATS), "repeats", row="speculation"),
    Control("raw_prompt", "Raw prompt", "On: the prompt's own tokens. Off: an instruct target's chat template wraps "
            "it as a user turn (models without a template always get the raw prompt).", False, row="sampling"),
    Control("context", "Context draft", "On: where the answer copies from the prompt or from itself, SD and Mirror-SD "
            "verify windows copied from there (yellow tokens), as long as the latency model says pays; elsewhere the "
            "draft model drafts. Never changes the output.", ContextConfig.enabled, row="speculation"),
    Control("format", "Format", "auto: the pair's own.", "auto"),
    Control("zero_windows", "Zero windows", "On: each step SD and Mirror-SD propose a window only where the latency "
            "model, on the run's own costs and acceptance, says it commits more tokens per millisecond than a plain "
            "target step, and take a plain step (a window of zero) elsewhere; γ is then the longest window. Off: a "
            "γ-token window every step (raw speculation). Never changes the output.", SpecConfig.zero_windows,
            row="speculation"),
)
CONTROLS = tuple(c.name for c in RUN_CONTROLS)
BY_NAME = {c.name: c for c in RUN_CONTROLS}
BOUNDS = {c.name: c.bounds for c in RUN_CONTROLS if c.bounds}   # (lowest, highest) of the page's numbers
DEFAULTS = {c.name: c.default for c in RUN_CONTROLS if c.default is not None}  # all but the pair and the prompt
INFO = {c.name: c.info for c in RUN_CONTROLS} | {"preset": "Fills Target and Draft; edit them for any model."}
LABELS = {c.name: c.said for c in RUN_CONTROLS if c.said}      # a number's name in an error line


@dataclass(frozen=True)
class ComparisonSettings:
    """One comparison as the page asked for it: which pair, which decoders, and the engine configs.
    (Not mirror_core.RunSettings, which records one engine run.)"""

    target: str
    draft: str | None
    prompt: str
    decoders: tuple[str, ...]        # in DECODER_ORDER
    max_new_tokens: int
    sampling: SamplingConfig
    spec: SpecConfig                 # γ, κ, ℓ_e left at 0 on the page: None, the loaded pair decides (engine.validate)
    live_plots: bool = True          # True: the comparison ends with its runs replayed at their measured pace
    repeats: int = 1                 # comparisons per Run; odd-numbered repeats (0-based) run in reverse order
    raw_prompt: bool = False         # True: tokenize the prompt as it is, without the target's chat template
    format: str = "auto"             # the target's format (DTYPE_CHOICES; auto: the pair's own)

    def requests(self, prompt_ids: tuple[int, ...]) -> list[Request]:
        """Every run of the comparison, repeat after repeat (DECODER_ORDER, then reversed, alternately)."""
        return [Request(prompt_ids=prompt_ids, decoder=d, max_new_tokens=self.max_new_tokens,
                        sampling=self.sampling, spec=self.spec)
                for r in range(self.repeats) for d in (self.decoders[::-1] if r % 2 else self.decoders)]


def controls_by_name(values: Sequence[object]) -> dict[str, object]:
    """The /run endpoint's positional values named by CONTROLS: the one place that zips them."""
    if len(values) != len(CONTROLS):
        raise MirrorError(f"a run takes {len(CONTROLS)} values ({', '.join(CONTROLS)}), got {len(values)}")
    return dict(zip(CONTROLS, values))


def settings_from_ui(values: Mapping[str, object]) -> ComparisonSettings:
    """The one mapping from the page's raw values (control name → value) to configs; raises MirrorError
    with a readable line."""
    v = _check_names(values)
    target = _as_text(v["target"], "Target").strip()
    if not target:
        raise MirrorError("no target model: pick a pair or type a Hugging Face id / local folder under Target")
    draft = _as_text(v["draft"], "Draft").strip()
    prompt = check_prompt_text(_as_text(v["prompt"], "the prompt"))
    decoders = v["decoders"]
    decoders_chosen = tuple(d for d in DECODER_ORDER if isinstance(decoders, (list, tuple)) and d in decoders)
    if not decoders_chosen:
        raise MirrorError("choose at least one decoder to run")
    exit_layer = _bounded("exit_layer", _as_int(v["exit_layer"], "exit layer ℓ_e"))
    gamma, kappa = _bounded("gamma", _as_int(v["gamma"], "γ")), _bounded("kappa", _as_int(v["kappa"], "κ"))
    spec = SpecConfig(gamma=gamma or None, kappa=kappa or None, exit_layer=exit_layer or None,  # 0: the pair's
                      branch_budget=_bounded("branch_budget", _as_int(v["branch_budget"], "branch budget")),
                      context=ContextConfig(enabled=_as_flag(v["context"], "context draft")),
                      zero_windows=_as_flag(v["zero_windows"], "zero windows"))
    sampling = SamplingConfig(temperature=_bounded("temperature", _as_float(v["temperature"], "temperature")),
                              top_k=_bounded("top_k", _as_int(v["top_k"], "top-k")),
                              top_p=_bounded("top_p", _as_float(v["top_p"], "top-p")),
                              seed=_bounded("seed", _as_int(v["seed"], "seed")), rule=v["rule"])
    max_new = _bounded("max_new_tokens", _as_int(v["max_new_tokens"], "max new tokens"))
    live, raw = _as_flag(v["live_plots"], "live plots"), _as_flag(v["raw_prompt"], "raw prompt")
    repeats = _bounded("repeats", _as_int(v["repeats"], "repeats"))
    fmt = v["format"]
    if fmt not in DTYPE_CHOICES:
        raise MirrorError(f"format must be one of {', '.join(DTYPE_CHOICES)}, got {fmt!r}; nothing was run")
    return ComparisonSettings(target, draft or None, prompt, decoders_chosen, max_new, sampling, spec, live, repeats, raw,
                              fmt)


def format_choices(info=None) -> list[tuple[str, str]]:
    """The Format control's choices: every format before a pair has loaded; then auto (named: the pair's own) and
    the formats its target offers (PairInfo.target_formats)."""
    if info is None or not info.target_formats:
        return [("auto", "auto")] + [(f, f) for f in DTYPE_CHOICES[1:]]
    return [(f"auto ({info.pair_format})", "auto")] + [(f, f) for f in info.target_formats]


def _bounded(name: str, value):
    """The value if the page's BOUNDS allow it; otherwise one line naming the range (never clamped silently)."""
    lo, hi = BOUNDS[name]
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        allowed = f"{lo}..{hi}" if hi is not None else f"≥ {lo}"
        raise MirrorError(f"{LABELS[name]} must be in {allowed} on this page, got {value:g}; nothing was run")
    return value


def _check_names(values) -> Mapping[str, object]:
    """Exactly the CONTROLS names, or one line saying which are missing or unknown."""
    if not isinstance(values, Mapping):
        raise MirrorError(f"the run settings must map control names to values, got {type(values).__name__}")
    missing = [name for name in CONTROLS if name not in values]
    unknown = [repr(name) for name in values if name not in CONTROLS]
    if missing or unknown:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(unknown)}"] if unknown else [])
        raise MirrorError(f"the run settings do not match the page's controls ({'; '.join(problems)})")
    return values


def load_examples(path: str) -> list[str]:
    """Example prompts from assets/examples.json: {"prompts": [...]}, or [] when the file is missing."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    return [str(p) for p in data.get("prompts", [])]


def _as_text(value, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MirrorError(f"{name} must be text, got {type(value).__name__}")
    return value


def _as_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise MirrorError(f"{name} must be true or false, got {value!r}")
    return value


def _as_int(value, name: str) -> int:
    try:
        f = float(value)
        if f == int(f):
            return int(f)
    except (TypeError, ValueError, OverflowError):
        pass
    raise MirrorError(f"{name} must be a whole number, got {value!r}")


def _as_float(value, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise MirrorError(f"{name} must be a number, got {value!r}") from None
