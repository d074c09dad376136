"""Held-out metrics for the saved model bundle, measured on its files loaded as the engine loads them (float32; a
GGUF target dequantised)."""
import json
import os
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from mirror_core.models.gguf_blocks import own_gguf, tensor_index
from mirror_core.models.loading import ModelSpec, load_model
from mirror_core.models.ss_draft import SSDraftForCausalLM, SSDraftOutput, cache_length, truncate_cache
from training.toy_pair import card, data
from training.toy_pair.config import TrainConfig

MODEL_NAMES = ("target", "draft_ar", "draft_ss")
TOP_KS = (1, 4, 8)


def evaluate_speculation(out_dir: str, prompts: list, n_tokens: int) -> dict:
    """τ, acceptance, hit rate and Ω̂_κ of each draft with the engine at the CLI's and app's default γ and κ
    (greedy, serial inline lane, which rolls out every branch; float32 rather than the dtype a timing would choose,
    and the draft model alone, without the context draft, whose windows follow this machine's timings: the numbers
    here do not depend on timing), pooled over the held-out prompts; outputs checked against ar."""
    from mirror_core import LaneConfig, MirrorEngine, Request, SpecConfig
    from mirror_core.config import DEFAULT_GAMMA, DEFAULT_KAPPA, ContextConfig
    from mirror_core.metrics import RunSummary

    # toy drafts have no profile: the pair's choice is DEFAULT_GAMMA, DEFAULT_KAPPA
    # raw speculation, a window every step (windows of zero follow this machine's timings too)
    spec = SpecConfig(DEFAULT_GAMMA, DEFAULT_KAPPA, context=ContextConfig(enabled=False), zero_windows=False)
    result = {"settings": {"gamma": spec.gamma, "kappa": spec.kappa, "max_new_tokens": n_tokens,
                           "prompts": len(prompts), "temperature": 0.0, "dtype": "float32", "context_draft": False}}
    target, lanes = os.path.join(out_dir, "target"), LaneConfig(kind="inline", dtype="float32")
    for name in MODEL_NAMES[1:]:
        with MirrorEngine.load(target, os.path.join(out_dir, name), lanes) as engine:
            for decoder in ("sd", "mirror"):
                summaries, equal, fallbacks = [], True, 0
                for p in prompts:
                    ar = engine.generate(Request(p.ids, "ar", n_tokens, stop_at_eos=False))
                    end = engine.generate(Request(p.ids, decoder, n_tokens, spec=spec, stop_at_eos=False))
                    equal &= end.token_ids == ar.token_ids
                    fallbacks += end.fallback is not None
                    summaries.append(end.summary)
                pooled = RunSummary.pool(summaries)  # counters added over the prompts, then the metrics
                result[f"{name}/{decoder}"] = {
                    "tau": pooled.tau, "acceptance_rate": pooled.acceptance_rate, "hit_rate": pooled.hit_rate,
                    "exit_overlap_top_kappa": pooled.exit_overlap,
                    "draft_tokens_per_forward": pooled.draft_tokens_per_forward,
                    "output_equals_ar": equal, "runs_that_fell_back_to_the_target": fallbacks}
    return result


def reevaluate(out_dir: str) -> dict:
    """Re-measure every held-out metric of an existing bundle with the current code and rewrite its card
    (the training, corpus and configuration records are kept)."""
    with open(os.path.join(out_dir, "model_card.json")) as f:
        card_data = json.load(f)
    cfg = TrainConfig.from_record(card_data["config"])
    card_data.update(evaluate_bundle(out_dir, data.load_corpus(cfg.corpus_dir), cfg))
    card.write(out_dir, card_data)
    return card_data


def repeated_ngram_ends(sequence: list[int], n: int = 4) -> list[bool]:
    """For each position i: does the n-gram ending at i repeat one that ended earlier in the sequence?"""
    seen, ends = set(), [False] * len(sequence)
    for i in range(n - 1, len(sequence)):
        gram = tuple(sequence[i - n + 1: i + 1])
        ends[i] = gram in seen
        seen.add(gram)
    return ends


def repeated_4gram_fraction(sequence: list[int], n_generated: int) -> float:
    """Share of generated tokens that complete a 4-gram already seen earlier in prompt + generation."""
    return sum(repeated_ngram_ends(sequence)[len(sequence) - n_generated:]) / max(n_generated, 1)


def reference_repetition(prompts: list[data.HeldoutPrompt], n: int) -> dict:
    """The same repeated-4-gram share on the held-out text itself (each prompt followed by its true next n
    tokens), per kind: how much repetition the documents have where the samples were taken."""
    by_kind = defaultdict(list)
    for p in prompts:
        if len(p.following) == n:
            by_kind[p.kind].append(repeated_4gram_fraction(list(p.ids + p.following), n))
    return {kind: sum(v) / len(v) for kind, v in by_kind.items()}


@torch.inference_mode()
def llama_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain KV-cached greedy decoding for exactly n tokens (no stop at EOT, so samples compare)."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens = [int(out.logits[0, -1].argmax())]
    while len(tokens) < n:
        out = model(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def _nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="sum").item()


@torch.inference_mode()
def teacher_forced_metrics(models: dict, chunks: dict[str, torch.Tensor], batch_size: int = 8) -> dict:
    """Validation NLL per model and kind, early-exit top-k overlap per layer, draft agreement with the target."""
    target, ar, ss = models["target"], models["draft_ar"], models["draft_ss"]
    n_layers, n_streams = target.config.num_hidden_layers, ss.config.num_streams
    sums = defaultdict(float)  # raw counters; rates are derived below
    for kind, kind_chunks in chunks.items():
        for batch in kind_chunks.split(batch_size):
            x, y = batch[:, :-1], batch[:, 1:]  # [B, T] each
            out = target(x, output_hidden_states=True, use_cache=False)
            greedy = out.logits.argmax(-1)  # [B, T] the target's greedy token at each position
            sums[kind, "positions"] += y.numel()
            sums["target", kind, "nll"] += _nll_sum(out.logits, y)
            for layer in range(1, n_layers):
                exit_logits = target.lm_head(target.model.norm(out.hidden_states[layer]))  # [B, T, V]
                top = exit_logits.topk(max(TOP_KS), dim=-1).indices  # [B, T, 8]
                for k in TOP_KS:
                    sums["exit", kind, layer, k] += (top[..., :k] == greedy[..., None]).any(-1).sum().item()
            ar_logits = ar(x, use_cache=False).logits  # [B, T, V]
            sums["draft_ar", kind, "nll"] += _nll_sum(ar_logits, y)
            sums["draft_ar", kind, "agree"] += (ar_logits.argmax(-1) == greedy).sum().item()
            ss_out = ss(x)
            sums["draft_ss", kind, "nll"] += _nll_sum(ss_out.logits, y)
            sums["draft_ss", kind, "agree"] += (ss_out.logits.argmax(-1) == greedy).sum().item()
            t = x.shape[1]
            for j in range(1, n_streams + 1):
                stream_top1 = ss_out.stream_logits[:, : t - j, j - 1].argmax(-1)  # [B, T-j] predicts token t+1+j
                sums["stream", kind, j, "agree"] += (stream_top1 == greedy[:, j:]).sum().item()
                sums["stream", kind, j, "correct"] += (stream_top1 == y[:, j:]).sum().item()
                sums["stream", kind, j, "positions"] += stream_top1.numel()
    return _derive(sums, chunks, n_layers, n_streams)


def _derive(sums: dict, chunks: dict, n_layers: int, n_streams: int) -> dict:
    """Rates from the raw counters: nats/token, overlap shares, agreement shares."""
    kinds = list(chunks)
    pos = {k: sums[k, "positions"] for k in kinds}
    result = {"val_tokens": {k: int(pos[k]) for k in kinds}}
    result["val_loss"] = {m: {k: sums[m, k, "nll"] / pos[k] for k in kinds} for m in MODEL_NAMES}
    result["exit_overlap"] = {k: {str(layer): {str(kk): sums["exit", k, layer, kk] / pos[k] for kk in TOP_KS}
                                  for layer in range(1, n_layers)} for k in kinds}
    result["agreement_top1"] = {m: {k: sums[m, k, "agree"] / pos[k] for k in kinds} for m in ("draft_ar", "draft_ss")}
    stream = lambda k, j, what: sums["stream", k, j, what] / sums["stream", k, j, "positions"]  # noqa: E731
    result["streams"] = {str(j): {k: {"agreement_with_target": stream(k, j, "agree"),
                                      "accuracy_on_data": stream(k, j, "correct")} for k in kinds}
                         for j in range(1, n_streams + 1)}
    return result


def generation_metrics(models: dict, tokenizer, prompts: list[data.HeldoutPrompt], n: int) -> dict:
    """Greedy continuations of every held-out prompt: repeated-4-gram share per kind, the first sample of
    each kind, SS tokens/forward."""
    result = {}
    for name, model in models.items():
        fractions, per_forward, samples = defaultdict(list), [], {}
        for p in prompts:
            if name == "draft_ss":
                tokens, steps = ss_greedy_generate(model, list(p.ids), n)
                per_forward += steps
            else:
                tokens = llama_greedy(model, list(p.ids), n)
            fractions[p.kind].append(repeated_4gram_fraction(list(p.ids) + tokens, len(tokens)))
            if p.kind not in samples:
                samples[p.kind] = {"prompt_source": p.source, "prompt": tokenizer.decode(list(p.ids)),
                                   "continuation": tokenizer.decode(tokens),
                                   "repeated_4gram_fraction": fractions[p.kind][-1]}
        result[name] = {"samples": samples, "new_tokens": n,
                        "repeated_4gram_fraction": {k: sum(v) / len(v) for k, v in fractions.items()},
                        "n_prompts": {k: len(v) for k, v in fractions.items()}}
        if per_forward:
            result[name]["self_speculation_tokens_per_forward"] = sum(per_forward) / len(per_forward)
    return result


@torch.inference_mode()
def decode_step_ms(model, prefix_len: int, reps: int = 40) -> float:
    """Median wall time of a one-token cached forward after prefix_len tokens, on 1 intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prefix = torch.zeros(1, prefix_len, dtype=torch.long)
        token = torch.zeros(1, 1, dtype=torch.long)
        is_ss = isinstance(model, SSDraftForCausalLM)
        cache = model(prefix).cache if is_ss else model(prefix, use_cache=True).cache
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            if is_ss:
                model(token, cache=cache)  # main + lookahead streams; the returned cache is a new list
            else:
                model(token, cache=cache, use_cache=True)
                cache.crop(-1)  # undo the append so every call sees the same prefix
            times.append(time.perf_counter() - t0)
        return 1e3 * sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(threads)


def model_sizes(out_dir: str, models: dict) -> dict:
    """Parameter counts (tied weights once) and each model's weights file: its format and size on disk."""
    sizes = {}
    for name, model in models.items():
        path, fmt = weights_file(os.path.join(out_dir, name))
        sizes[name] = {"params": sum(p.numel() for p in model.parameters()), "file": os.path.basename(path),
                       "format": fmt, "file_mb": os.path.getsize(path) / 1e6,
                       "layers": model.config.num_hidden_layers, "hidden_size": model.config.hidden_size}
    sizes["total_mb"] = sum(s["file_mb"] for s in sizes.values())
    return sizes


def weights_file(folder: str) -> tuple[str, str]:
    """A saved model's weights file and its format: "GGUF Q8_0+F32" (its tensor types, most used first) or
    "safetensors F16" (its dtypes)."""
    from collections import Counter

    from safetensors import safe_open

    gguf = own_gguf(folder)
    if gguf is not None:
        kinds = Counter(t["type"] for t in tensor_index(gguf))
        return gguf, "GGUF " + "+".join(k for k, _ in kinds.most_common())
    path = os.path.join(folder, "model.safetensors")
    with safe_open(path, "np") as f:
        kinds = Counter(str(f.get_slice(k).get_dtype()) for k in f.keys())
    return path, "safetensors " + "+".join(k for k, _ in kinds.most_common())


def evaluate_bundle(out_dir: str, corpus: data.Corpus, cfg: TrainConfig) -> dict:
    """All held-out metrics for the model card, from the files on disk."""
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(out_dir, "target"))
    models = {n: load_model(ModelSpec(os.path.join(out_dir, n)), draft=n != "target") for n in MODEL_NAMES}  # float32
    chunks = {kind: data.eval_chunks(data.token_stream(tokenizer, corpus.select("val", kind)), cfg.context,
                                     cfg.eval_chunks) for kind in ("code", "prose") if corpus.select("val", kind)}
    prompts = data.heldout_prompts(tokenizer, corpus, cfg.n_prompts, cfg.prompt_tokens, cfg.sample_tokens)
    metrics = teacher_forced_metrics(models, chunks)
    metrics["exit_layer"] = cfg.resolved_exit_layer
    metrics["generation"] = generation_metrics(models, tokenizer, prompts, cfg.sample_tokens)
    metrics["generation"]["reference_repetition"] = reference_repetition(prompts, cfg.sample_tokens)
    metrics["sizes"] = model_sizes(out_dir, models)
    metrics["decode_step_load"] = {"load_average_1min": os.getloadavg()[0], "cpus": os.cpu_count()}
    metrics["decode_step_ms"] = {n: decode_step_ms(m, min(128, cfg.context)) for n, m in models.items()}
    metrics["speculation"] = evaluate_speculation(out_dir, prompts, cfg.sample_tokens)
    return metrics


def write_model_card(out_dir: str, card_data: dict) -> None:
    card.write(out_dir, card_data)


@torch.inference_mode()
def ss_greedy_generate(model: SSDraftForCausalLM, prompt_ids: list[int], n: int) -> tuple[list[int], list[int]]:
    """Self-verifying greedy decode (docs/ALGORITHM.md §5): up to n_str+1 tokens per forward, same output as main greedy.

    Returns (tokens[:n], tokens emitted by each decode forward); the prefill forward, which emits the
    first token, is not listed.
    """
    dev = model.embed_tokens.weight.device
    out = model(torch.tensor([prompt_ids], device=dev))
    c = int(out.logits[0, -1].argmax())  # committed, not yet in the cache
    lookahead = out.stream_logits[0, -1].argmax(-1).tolist()  # [n_str] proposals for the tokens after c
    tokens, per_forward = [c], []
    while len(tokens) < n:
        pos = cache_length(out.cache)
        out = model(torch.tensor([[c] + lookahead], device=dev), cache=out.cache)
        main_next = out.logits[0].argmax(-1).tolist()  # [1+n_str]: main's token after each window entry
        accepted = 0
        while accepted < len(lookahead) and lookahead[accepted] == main_next[accepted]:
            accepted += 1
        c = main_next[accepted]
        emitted = lookahead[:accepted] + [c]
        out = SSDraftOutput(out.logits, out.stream_logits, truncate_cache(out.cache, pos + 1 + accepted))
        lookahead = out.stream_logits[0, accepted].argmax(-1).tolist()  # streams at the last accepted position
        tokens += emitted
        per_forward.append(len(emitted))
    return tokens[:n], per_forward


def main(argv: list[str] | None = None) -> dict:
    """`python -m training.toy_pair.evaluate DIR`: re-measure a saved pair and rewrite its card."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m training.toy_pair.evaluate", description=main.__doc__)
    parser.add_argument("pair_dir", help="a folder written by python -m training.toy_pair (target/, draft_ar/, draft_ss/)")
    card_data = reevaluate(parser.parse_args(argv).pair_dir)
    print(card.render_markdown(card_data))
    return card_data


if __name__ == "__main__":
    main()
