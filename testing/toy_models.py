"""Tiny Hugging Face model pairs built from configs (no downloads), and the greedy references the tests compare with."""
from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()

VOCAB = 96
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gpt2")


def _config(arch: str, layers: int, hidden: int = 64, vocab: int = VOCAB, eos: int | None = None):
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=eos, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if arch == "llama":
        return LlamaForCausalLM, LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2ForCausalLM, Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3ForCausalLM, Qwen3Config(head_dim=hidden // 4, **common)
    if arch == "mistral":
        return MistralForCausalLM, MistralConfig(sliding_window=None, **common)
    return GPT2LMHeadModel, GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512,
                                       eos_token_id=eos, bos_token_id=None)


def _is_residual_out(name: str) -> bool:
    return name.endswith(("o_proj.weight", "down_proj.weight", "c_proj.weight"))


def _in_first_layer(name: str) -> bool:
    return ".layers.0." in name or ".h.0." in name


def build_pair(root: str, arch: str, target_layers: int = 4, hidden: int = 64, seed: int = 0,
               eos: int | None = None, vocab: int = VOCAB, draft_noise: float = 0.1) -> tuple[str, str]:
    """A random target and a 1-layer draft initialised from its embedding, first layer, norm and head
    (so acceptance is neither 0 nor 1)."""
    cls, cfg = _config(arch, target_layers, hidden, vocab, eos)
    torch.manual_seed(seed)
    target = cls(cfg).eval()
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() == 2:
                p.mul_(3.0)  # sharper distributions than the default init, so greedy ties are rare
            if name.endswith(("lm_head.weight", "embed_tokens.weight", "wte.weight")):
                p.mul_(4.0)
            if _is_residual_out(name) and not _in_first_layer(name):
                p.mul_(0.5)  # later layers nudge the first layer's prediction, so a 1-layer draft agrees often
    dcls, dcfg = _config(arch, 1, hidden, vocab, eos)
    draft = dcls(dcfg).eval()
    own = draft.state_dict()
    for name, tensor in target.state_dict().items():
        if name in own and own[name].shape == tensor.shape:
            own[name].copy_(tensor)
    torch.manual_seed(seed + 100)
    with torch.no_grad():  # perturb the draft a little so it is not the target's own first layer
        for p in draft.parameters():
            p.add_(draft_noise * p.std() * torch.randn_like(p) if p.numel() > 1 else 0.0)
    tag = f"{arch}_s{seed}_e{eos}_v{vocab}_h{hidden}_n{target_layers}_z{draft_noise}"
    t_dir, d_dir = os.path.join(root, tag + "_target"), os.path.join(root, tag + "_draft")
    target.save_pretrained(t_dir)
    draft.save_pretrained(d_dir)
    return t_dir, d_dir


def hf_greedy(path: str, prompt: tuple[int, ...], n: int) -> list[int]:
    """The reference: transformers' own loading (its GGUF loader for a folder whose weights are a GGUF, as the toy
    target's are) and its own greedy generate."""

    model = _cached_model(path)
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=0)
    return out[0, len(prompt):].tolist()


_MODELS: dict = {}


def _cached_model(path: str):
    from transformers import AutoModelForCausalLM

    from mirror_core.models.gguf_blocks import WEIGHTS_FILE, own_gguf

    if path not in _MODELS:
        gguf = {"gguf_file": WEIGHTS_FILE, "dtype": torch.float32} if own_gguf(path) else {}
        _MODELS[path] = AutoModelForCausalLM.from_pretrained(path, **gguf).eval()
    return _MODELS[path]


def prompts(n: int, seed: int = 0, vocab: int = VOCAB) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(1, 12, (1,), generator=g))
        out.append(tuple(torch.randint(0, vocab, (length,), generator=g).tolist()))
    return out


@torch.inference_mode()
def main_greedy_generate(model, prompt_ids: list[int], n: int) -> list[int]:
    """Reference: plain one-token-per-forward greedy decoding of the main stream."""
    dev = model.embed_tokens.weight.device
    out = model(torch.tensor([prompt_ids], device=dev), with_streams=False)
    tokens = [int(out.logits[0, -1].argmax())]
    while len(tokens) < n:
        out = model(torch.tensor([[tokens[-1]]], device=dev), cache=out.cache, with_streams=False)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens[:n]


def reduce_draft(draft_dir: str, ids: list[int], out: str) -> str:
    """A reduced-vocabulary copy of a Llama draft (mirror_core/models/vocab.py): embeddings and head rows of `ids`,
    plus one "other" row (the mean embedding), and its draft_vocab.json."""
    from mirror_core.models.vocab import VocabMap

    draft = LlamaForCausalLM.from_pretrained(draft_dir).eval()
    cfg = LlamaConfig(**{**draft.config.to_dict(), "vocab_size": len(ids) + 1})
    small = LlamaForCausalLM(cfg).eval()
    state = draft.state_dict()
    with torch.no_grad():
        for name, tensor in small.state_dict().items():
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                full = state[name]
                tensor.copy_(torch.cat([full[ids], full.mean(0, keepdim=True)]))
            else:
                tensor.copy_(state[name])
    small.save_pretrained(out)
    VocabMap.from_ids(ids, int(draft.config.vocab_size)).save(out)
    return out


def random_exit_head(target_dir: str, layer: int, ids: list[int] | None, out: str, noise: float = 0.3,
                     seed: int = 0) -> str:
    """An exit head (mirror_core/models/exit_head.py) for a Llama target: identity plus noise, so its readout differs
    from the logit lens; saved into `out` (a draft folder, where "auto" finds it)."""
    from mirror_core.models.exit_head import ExitHeadWeights

    target = LlamaForCausalLM.from_pretrained(target_dir)
    c = target.config
    g = torch.Generator().manual_seed(seed)
    h = c.hidden_size
    ids = list(range(c.vocab_size)) if ids is None else ids
    ExitHeadWeights(layer, h, c.num_hidden_layers, c.vocab_size,
                    torch.eye(h) + noise * torch.randn(h, h, generator=g) / h ** 0.5, torch.zeros(h),
                    target.model.norm.weight.detach().clone(), torch.tensor(ids)).save(out)
    return out


def feature_draft(target_dir: str, out: str, layer: int = 2, ids: list[int] | None = None, num_layers: int = 1,
                  steps: int = 150, seed: int = 0) -> str:
    """A feature-reading draft (mirror_core/models/feature_draft.py) for a Llama toy target, reading h^(layer), with
    an exit head at that layer in the same folder; fitted for `steps` Adam steps (training-time test, depth 3) to
    the target's greedy continuations of random prompts, so that it agrees with the target often but not always
    (steps 0: as initialised from the target, for tests of what does not depend on how well it drafts)."""
    from mirror_core.models.feature_draft import from_target
    from mirror_core.models.vocab import VocabMap

    target = LlamaForCausalLM.from_pretrained(target_dir).eval()
    v = target.config.vocab_size
    ids = list(range(v)) if ids is None else ids
    vmap = VocabMap.from_ids(ids, v)
    torch.manual_seed(seed)
    model = from_target(target, vmap.target_ids, num_layers, layer).train()
    if steps > 0:
        _fit_feature_draft(model, target, target_dir, vmap, layer, steps, seed)
    model.eval().save(out)
    vmap.save(out)
    random_exit_head(target_dir, layer, ids, out, noise=0.1, seed=seed)
    return out


def _fit_feature_draft(model, target, target_dir: str, vmap, layer: int, steps: int, seed: int) -> None:
    """`steps` Adam steps of the training-time test (depth 3) on the target's greedy continuations."""
    import torch.nn.functional as F

    from mirror_core.models.feature_draft import train_step_outputs

    seqs = [list(p) + hf_greedy(target_dir, p, 24) for p in prompts(32, seed=seed + 11)]
    width = min(len(q) for q in seqs)
    x = torch.tensor([q[:width] for q in seqs])                                             # [B, L]
    with torch.no_grad():
        feats = target(input_ids=x, output_hidden_states=True).hidden_states[layer]        # [B, L, H]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    depths = 3
    for _ in range(steps):
        outs = train_step_outputs(model, vmap.to_draft[x[:, 1:]], feats[:, :-1], depths)
        loss = 0.0
        for d, g in enumerate(outs, 1):
            z = model.logits(g[:, : x.shape[1] - 1 - d])                                    # predicts x_{p+d+1}
            loss = loss + F.cross_entropy(z.reshape(-1, z.shape[-1]), vmap.to_draft[x[:, d + 1:]].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
