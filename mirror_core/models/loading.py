"""Load Hugging Face causal LMs and tokenizers onto devices; check that a pair can work together."""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from urllib.parse import urlparse

import torch

from .. import machine
from ..config import MirrorError
from .architectures import SUPPORTED_MODEL_TYPES, layout
from .gguf_blocks import own_gguf, read_weights
from .prepared import REGISTRY, resolve_source

HUB_PROBE_S = 1.5   # how long loading a hub id waits to learn that the hub cannot be reached
HUB_MEMO_S = 60.0   # a probe's answer is reused this long (a pair's config, tokenizer and weights: one probe)
_probes: dict[str, tuple[float, bool]] = {}  # hub host → (when probed, reachable)


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from (hub id, local folder, or a name in prepared.REGISTRY) and where it runs."""
    source: str
    device: str = "cpu"
    trust_remote_code: bool = False


def load_config(spec: ModelSpec, draft: bool = False):
    """The model's config, checked to be an architecture a runner supports (SS drafts only as drafts)."""
    from transformers import AutoConfig

    from . import ss_draft  # noqa: F401  (registers our speculative-streaming draft with the Auto classes)

    supported = SUPPORTED_MODEL_TYPES + ((ss_draft.SSDraftConfig.model_type,) if draft else ())
    spec = replace(spec, source=resolve_source(spec.source))
    if _looks_like_path(spec.source) and not os.path.isdir(spec.source):
        raise MirrorError(f"model folder {spec.source!r} does not exist")
    access = hub_access(spec.source)  # a hub id that cannot be fetched: its own error, at once
    try:
        config = AutoConfig.from_pretrained(spec.source, trust_remote_code=spec.trust_remote_code, **access)
    except Exception as exc:  # OSError, ValueError, hub errors: all mean "not a loadable model here"
        raise MirrorError(f"cannot load model {spec.source!r}: {_first_line(exc)}") from None
    if getattr(config, "model_type", None) not in supported:
        raise MirrorError(f"{spec.source!r} has unsupported architecture {getattr(config, 'model_type', '?')!r}; "
                          f"supported{' as a draft' if draft else ''}: {', '.join(supported)}")
    _require_safetensors(spec.source)  # before anything loads, on either lane
    return config


def load_model(spec: ModelSpec, draft: bool = False, spread: tuple[str, ...] = ()):
    """AutoModelForCausalLM from a hub id or folder: float32 on a CPU (runners/calibrate.py then chooses each
    lane's matmul dtype), the stored dtype on an accelerator. `spread`: the devices its layers are split over
    by an accelerate device map (device_map_for), the embedding on the first."""
    from transformers import AutoModelForCausalLM

    device = machine.check(spec.device)
    for other in spread:
        machine.check(other)
    config = load_config(spec, draft)
    spec = replace(spec, source=resolve_source(spec.source))
    dtype = torch.float32
    if any(torch.device(d).type != "cpu" for d in spread or (spec.device,)) and \
            getattr(config, "dtype", None) in (torch.float16, torch.bfloat16):
        dtype = config.dtype
    placement = {"device_map": device_map_for(config, spread)} if spread else {}
    gguf = own_gguf(spec.source)
    if gguf is not None:
        return _place(_from_gguf(gguf, config).to(dtype), placement, device).eval()
    access = hub_access(spec.source)
    try:  # safetensors only: pickled .bin weights can run code when loaded
        model = AutoModelForCausalLM.from_pretrained(spec.source, dtype=dtype, trust_remote_code=spec.trust_remote_code,
                                                     use_safetensors=True, **placement, **access)
    except Exception as exc:
        raise MirrorError(f"{spec.source!r} is not a loadable causal LM (safetensors weights are required): "
                          f"{_first_line(exc)}") from None
    return (model if spread else model.to(device)).eval()


def _from_gguf(path: str, config):
    """The model its config describes with every weight gguf's dequantisation of the GGUF (models/gguf_blocks.py):
    float32, the function the kernel computes streaming the same blocks ("float32 as q8_0")."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    params = model.state_dict()
    why = f"cannot read {path} as the Llama model its config.json describes"
    try:
        weights = read_weights(path, config)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as exc:
        raise MirrorError(f"{why}: {_first_line(exc)}") from None
    wrong = sorted(set(params) ^ set(weights)) + sorted(n for n, w in weights.items()
                                                       if n in params and w.numel() != params[n].numel())
    if wrong:
        raise MirrorError(f"{why}: {wrong[0]} is missing, extra or of another size")
    model.load_state_dict({n: w.reshape(params[n].shape) for n, w in weights.items()})
    return model


def _place(model, placement: dict, device: torch.device):
    """A model built here on the CPU → its device, or its device map (accelerate's dispatch, as from_pretrained's)."""
    if not placement:
        return model.to(device)
    from accelerate import dispatch_model

    return dispatch_model(model, placement["device_map"])


def assistable(draft: str) -> bool:
    """Whether transformers' assisted generation can drive this draft: not a feature-reading one (it needs the
    target's hidden states, which assisted generation does not give a draft)."""
    from .feature_draft import is_feature_draft

    return not is_feature_draft(local_folder(draft))


def load_draft_over_target_vocab(spec: ModelSpec):
    """A draft as a plain Hugging Face model over the target's vocabulary, for peers that drive it themselves
    (assisted generation): a reduced-vocabulary draft becomes its full-vocabulary copy (models/vocab.full_vocab_copy)."""
    from .vocab import full_vocab_copy, load_vocab_map

    if not assistable(spec.source):
        raise MirrorError(f"{spec.source!r} is a feature-reading draft: it needs the target's hidden states, which "
                          "transformers' assisted generation does not give a draft; drop hf_assisted, or use the "
                          "token-only draft for it")
    model = load_model(spec, draft=True)
    vmap = load_vocab_map(local_folder(spec.source))
    return model if vmap is None else full_vocab_copy(model, vmap)


def device_map_for(config, spread: tuple[str, ...]) -> dict[str, str]:
    """An accelerate device map over `spread`: with distinct accelerators, accelerate's infer_auto_device_map
    within 90 % of each one's free memory (decoder layers never split); otherwise (e.g. two entries for the same
    device, as the CPU test uses) the decoder layers in equal consecutive shares, the embedding with the first
    share, the final norm and LM head with the last."""
    layers_path, norm_path = layout(config.model_type)
    n = int(config.num_hidden_layers if hasattr(config, "num_hidden_layers") else config.n_layer)
    if len(set(spread)) == len(spread) and all(torch.device(d).type not in ("cpu", "mps") for d in spread):
        from accelerate import infer_auto_device_map, init_empty_weights
        from transformers import AutoModelForCausalLM

        with init_empty_weights():
            meta = AutoModelForCausalLM.from_config(config)
        budget = {torch.device(d).index: int(0.9 * _free_bytes(torch.device(d))) for d in spread}
        placed = infer_auto_device_map(meta, max_memory=budget, no_split_module_classes=meta._no_split_modules)
        kind = torch.device(spread[0]).type
        return {name: f"{kind}:{where}" if isinstance(where, int) else where for name, where in placed.items()}
    out = {"": spread[0]}
    out.update({f"{layers_path}.{i}": spread[i * len(spread) // n] for i in range(n)})
    out.update({norm_path: spread[-1], "lm_head": spread[-1]})
    return out


def _free_bytes(device: torch.device) -> int:
    backend = getattr(torch, device.type)
    free, _total = backend.mem_get_info(device)
    return int(free)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(source: str):
    """The model's tokenizer, or None when the folder has none (then use prompt ids)."""
    from transformers import AutoTokenizer

    source = resolve_source(source)
    if os.path.isdir(source) and not any(os.path.exists(os.path.join(source, f)) for f in _TOKENIZER_FILES):
        return None  # transformers would build an empty tokenizer from the config alone
    try:
        return AutoTokenizer.from_pretrained(source, **hub_access(source))
    except Exception:
        return None


def hub_access(source: str) -> dict:
    """from_pretrained's keywords for `source`: {} for a folder, or a hub id the hub can serve; local_files_only for
    a hub id in the local Hugging Face cache while the hub cannot be reached; and for one that is in neither, a
    MirrorError at once (within HUB_PROBE_S), where the hub client would retry five times (about 30 s)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if os.path.isdir(source) or _looks_like_path(source):
        return {}
    try:
        cached = isinstance(try_to_load_from_cache(source, "config.json"), str)
    except Exception:  # not a valid hub id: transformers says why, without the network
        return {}
    offline = constants.is_offline_mode()
    if not offline and hub_reachable(constants.ENDPOINT):
        return {}
    if cached:
        return {"local_files_only": True}
    why = "HF_HUB_OFFLINE is set" if offline else f"{constants.ENDPOINT} cannot be reached"
    raise MirrorError(f"model {source!r} not found offline: it is not a local folder, not in the local Hugging Face "
                      f"cache, and {why}")


def hub_reachable(endpoint: str, timeout_s: float = HUB_PROBE_S) -> bool:
    """Whether a TCP connection to the hub's host opens within timeout_s (name lookup included: it runs in a
    thread, since a resolver can block longer than any socket timeout). Remembered for HUB_MEMO_S."""
    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    seen = _probes.get(host)
    if seen is not None and time.monotonic() - seen[0] < HUB_MEMO_S:
        return seen[1]
    answer: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=probe, name="mirror-hub-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    _probes[host] = (time.monotonic(), bool(answer and answer[0]))
    return _probes[host][1]


def encode_text(tokenizer, text: str, chat: bool = True) -> tuple[int, ...]:
    """Prompt text → ids. With chat (the default) and a tokenizer that has a chat template (an instruct model),
    the text is one user turn followed by the assistant's turn opening, as the model was tuned to read it;
    otherwise (raw) the text's own tokens."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        return tuple(int(t) for t in (ids["input_ids"] if isinstance(ids, dict) else ids))
    return tuple(tokenizer.encode(text))


def shared_vocab_size(target_config, draft_config, tok_target, tok_draft, draft_maps_to: int | None = None) -> int:
    """The vocabulary both models index the same way; raise if the pair disagrees.

    Padded embedding tables may differ in size (e.g. 151936 vs 152064); then the tokenizers
    must be identical and the logits are sliced to the tokenizer's length. A reduced-vocabulary
    draft (models/vocab.py) speaks the target vocabulary of `draft_maps_to` tokens through its map.
    """
    vt, vd = int(target_config.vocab_size), int(draft_maps_to or draft_config.vocab_size)
    if tok_target is not None and tok_draft is not None:
        if tok_target.get_vocab() != tok_draft.get_vocab():
            raise MirrorError("target and draft tokenizers have different vocabularies; pick a draft from the target's family")
        n = len(tok_target)
        if n > min(vt, vd):
            raise MirrorError(f"tokenizer has {n} tokens but a model has only {min(vt, vd)} embeddings")
        return n if vt != vd else vt
    if vt != vd:
        raise MirrorError(f"target vocabulary ({vt}) and draft vocabulary ({vd}) differ, and there is no tokenizer to reconcile them")
    return vt


def context_of(config) -> int | None:
    """The tokens a model config lets the model attend over (its position limits and sliding window; None: none)."""
    limits = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions", "sliding_window")]
    limits = [int(v) for v in limits if isinstance(v, int) and v > 0]
    return min(limits) if limits else None


def eos_ids(model) -> frozenset[int]:
    """The ids that end a model's answer (its generation config's, else its config's)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def local_folder(source: str | None) -> str | None:
    """The folder a model source names on this machine (a registry name's prepared folder), None for a hub id."""
    if source is None:
        return None
    if source in REGISTRY:
        return resolve_source(source)
    return source if os.path.isdir(source) else None


def _looks_like_path(source: str) -> bool:
    """Hub ids are 'name' or 'org/name'; anything else is meant as a local folder."""
    return source.startswith(("/", "./", "../", "~")) or source.count("/") > 1


def _require_safetensors(source: str) -> None:
    """A local folder must hold .safetensors weights (or its own GGUF: gguf_blocks.own_gguf); pickled ones (.bin, .pt,
    .pth) are refused, not loaded. (Hub ids are loaded with use_safetensors=True, so transformers refuses pickles there.)"""
    if not os.path.isdir(source):
        return
    files = os.listdir(source)
    if any(f.endswith(".safetensors") for f in files) or own_gguf(source):
        return
    pickles = sorted(f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt")))
    if pickles:
        raise MirrorError(f"{source!r} has only pickled weights ({', '.join(pickles[:3])}); only .safetensors "
                          "weights are loaded (convert them with save_pretrained, which writes safetensors)")
    raise MirrorError(f"{source!r} has no .safetensors weights (nor a model.gguf); it is not a loadable causal LM")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
