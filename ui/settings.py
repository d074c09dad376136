"""UI values → engine configs, in one place (`settings_from_ui`), plus the controls' defaults and help text."""
from __future__ import annotations

import json
from dataclasses import dataclass

from mirror_core import MirrorError, Request, SamplingConfig, SpecConfig
from mirror_core.config import check_prompt_text

# Decoder keys in the order they run (baseline first) and the names the page shows.
DECODER_ORDER = ("ar", "sd", "mirror")
DECODER_TITLES = {"ar": "Target-only AR (baseline)", "sd": "Vanilla SD", "mirror": "Mirror-SD"}
RULE_CHOICES = (("exact: Rule E, reproduces AR token for token with the same seed", "exact"),
                ("rejection: Rule R, Leviathan/Chen rejection sampling", "rejection"))

APP_MAX_NEW_TOKENS = 1024  # the page's cap per decoder (below the engine's MAX_NEW_TOKENS_CAP), checked server-side

# Every control's default value; the page and the tests both read these.
DEFAULTS = {"gamma": SpecConfig.gamma, "kappa": SpecConfig.kappa, "exit_layer": 0,
            "branch_budget": SpecConfig.branch_budget, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
            "rule": "exact", "max_new_tokens": 64, "seed": 0, "decoders": ["ar", "mirror"]}

INFO = {
    "prompt": "Text for models with a tokenizer; for models without one, comma-separated token ids (e.g. 1, 2, 3).",
    "preset": "Fills Target and Draft below; edit them to use any Hugging Face id or local folder.",
    "target": "The model whose output is reproduced exactly: a Hugging Face id (e.g. Qwen/Qwen3-1.7B) or a local folder.",
    "draft": "A smaller model with the same vocabulary (e.g. Qwen/Qwen3-0.6B); leave empty to run the AR baseline only.",
    "decoders": "Run one after another, each with both lanes to itself; AR is the baseline every speedup refers to.",
    "gamma": "γ: draft tokens per window the target verifies in one pass (1..16).",
    "kappa": "κ: early-exit candidates per slot sent to the draft lane; the draft rolls out a branch for each (1..64).",
    "branch_budget": "Branch rows the draft rolls out per step, the likeliest first: 0 = all κ(γ+1); −1 = auto "
                     "(as many as it finishes while the target runs its last layers). Never changes the output.",
    "exit_layer": "ℓ_e: target layer whose hidden state gives the early-exit top-κ (1..N−1); 0 = N/2 of the loaded target.",
    "temperature": "0 = greedy (output equals the target's greedy tokens). Above 0: sampling.",
    "top_k": "Keep only the k most likely tokens before sampling; 0 = off.",
    "top_p": "Nucleus sampling: keep the smallest set of tokens with this much probability; 1 = off.",
    "rule": "Acceptance rule when temperature > 0 (at 0 both are greedy matching).",
    "max_new_tokens": "New tokens per decoder (the prompt + this + γ + 2 must fit the models' context).",
    "seed": "Seeds each lane's random generator; same seed + rule exact = the same tokens as AR.",
}


@dataclass(frozen=True)
class RunSettings:
    """One comparison as the page asked for it: which pair, which decoders, and the engine configs."""

    target: str
    draft: str | None
    prompt: str
    decoders: tuple[str, ...]        # in DECODER_ORDER
    max_new_tokens: int
    sampling: SamplingConfig
    spec: SpecConfig

    def requests(self, prompt_ids: tuple[int, ...]) -> list[Request]:
        return [Request(prompt_ids=prompt_ids, decoder=d, max_new_tokens=self.max_new_tokens,
                        sampling=self.sampling, spec=self.spec) for d in self.decoders]


def settings_from_ui(prompt: str, target: str, draft: str, decoders, gamma, kappa, exit_layer, temperature,
                     top_k, top_p, rule, max_new_tokens, seed,
                     branch_budget=SpecConfig.branch_budget) -> RunSettings:
    """The one mapping from the page's raw values to configs; raises MirrorError with a readable line."""
    target = _as_text(target, "Target").strip()
    if not target:
        raise MirrorError("no target model: pick a pair or type a Hugging Face id / local folder under Target")
    draft = _as_text(draft, "Draft").strip()
    prompt = check_prompt_text(_as_text(prompt, "the prompt"))
    chosen = tuple(d for d in DECODER_ORDER if isinstance(decoders, (list, tuple)) and d in decoders)
    if not chosen:
        raise MirrorError("choose at least one decoder to run")
    exit_layer = _as_int(exit_layer, "exit layer ℓ_e")
    spec = SpecConfig(gamma=_as_int(gamma, "γ"), kappa=_as_int(kappa, "κ"), exit_layer=exit_layer or None,
                      branch_budget=_as_int(branch_budget, "branch budget"))
    sampling = SamplingConfig(temperature=_as_float(temperature, "temperature"), top_k=_as_int(top_k, "top-k"),
                              top_p=_as_float(top_p, "top-p"), seed=_as_int(seed, "seed"), rule=rule)
    max_new = _as_int(max_new_tokens, "max new tokens")
    if not 1 <= max_new <= APP_MAX_NEW_TOKENS:
        raise MirrorError(f"max new tokens must be in 1..{APP_MAX_NEW_TOKENS} on this page, got {max_new}")
    return RunSettings(target, draft or None, prompt, chosen, max_new, sampling, spec)


def encode_prompt(tokenizer, prompt: str) -> tuple[int, ...]:
    """Text through the tokenizer, or comma/space-separated ids when the model has none."""
    if tokenizer is not None:
        ids = tuple(tokenizer.encode(prompt))
        if not ids:
            raise MirrorError("the prompt encodes to no tokens")
        return ids
    try:
        ids = tuple(int(x) for x in prompt.replace(",", " ").split())
    except ValueError:
        raise MirrorError("this model has no tokenizer: type the prompt as token ids, e.g. 1, 2, 3") from None
    if not ids:
        raise MirrorError("the prompt has no token ids")
    return ids


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
