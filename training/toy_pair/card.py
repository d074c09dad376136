"""Render the training/evaluation record as model_card.json (machine-readable) and MODEL_CARD.md (for people)."""
import json
import os

NAMES = {"target": "target", "draft_ar": "AR draft", "draft_ss": "SS draft"}


def _table(header: list[str], rows: list[list]) -> list[str]:
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]


def _models_section(c: dict) -> list[str]:
    rows = []
    for key, label in NAMES.items():
        s, t, loss = c["sizes"][key], c["training"][key], c["val_loss"][key]
        rows.append([label, s["layers"], s["hidden_size"], f"{s['params'] / 1e6:.2f} M", s["format"],
                     f"{s['file_mb']:.1f}", f"{t['seconds'] / 60:.1f}", t["device"], t["steps"],
                     f"{t['tokens'] / 1e6:.2f} M", loss.get("code", float("nan")), loss.get("prose", float("nan"))])
    load = c["decode_step_load"]
    return (["## Models", ""]
            + _table(["model", "layers", "hidden", "params", "weights", "MB", "train min", "device", "steps",
                      "train tokens", "val loss code", "val loss prose"], rows)
            + _continued(c["training"]["target"]) + _unlikelihood(c) + _how_trained(c) + _continuations(c)
            + _target_gguf(c.get("target_gguf"))
            + ["", f"Total weights on disk: {c['sizes']['total_mb']:.1f} MB. Validation loss in nats/token "
                   "on held-out files (teacher-forced, context as trained), of the weights as shipped.", "",
               "One-token cached decode step (Hugging Face eager forward, fp32 on CPU, 1 intra-op thread, "
               "median, measured when this card was evaluated; the SS step includes its streams): "
               + ", ".join(f"{NAMES[k]} {v:.2f} ms" for k, v in c["decode_step_ms"].items())
               + f"; the machine's 1-minute load average was {load['load_average_1min']:.1f} on {load['cpus']} "
                 "CPUs as they ran (this process counts about 1; more means other work shared the machine).", ""])


def _how_trained(c: dict) -> list[str]:
    cfg = c["config"]
    precision = ("bf16 autocast forward passes with fp32 weights and optimizer state"
                 if cfg.get("precision") == "bf16" else "fp32")
    return ["", f"Trained with {precision}, {cfg['threads'] or 'the default number of'} intra-op threads"
                f"{', torch.compile' if cfg.get('compile') else ''}, batch {cfg['batch_size']} × {cfg['context']} "
                "tokens; saved in fp16" + (", the target then converted to Q8_0 (below)." if c.get("target_gguf")
                                           else ".")] + _ss_start(cfg)


def _target_gguf(g: dict | None) -> list[str]:
    """How the shipped target's Q8_0 GGUF was made from its float16 file, and how to make it again."""
    if g is None:
        return []
    rev = g["source"].rpartition(" ")[2] if "git commit" in g["source"] else None
    again = (f" `python -m training.toy_pair.to_gguf DIR/target --from-git {rev[:12]}` makes it again, byte for "
             "byte." if rev else "")
    return ["", f"The target is `{g['file']}` ({g['bytes'] / 1e6:.1f} MB, sha256 `{g['sha256'][:16]}…`): every "
                "linear map and the tied embedding / LM head in Q8_0 (blocks of 32 int8 weights with a float16 "
                f"scale), the norms float32; made by `{g['tool']}` from its float16 {g['source']} "
                f"({g['source_bytes'] / 1e6:.1f} MB, sha256 `{g['source_sha256'][:16]}…`).{again} The engine loads "
                "it dequantised by gguf (float32), and its exact kernel streams the same Q8_0 blocks "
                "(mirror_core/models/gguf_blocks.py)."]


def _ss_start(cfg: dict) -> list[str]:
    """Where the SS draft's weights started, when not (like the AR draft's) from the target's first layers."""
    if cfg.get("ss_init", "target") != "ar_draft":
        return []
    return ["", "The SS draft started from the AR draft trained just before it in this run (its embedding, layer and "
                "final norm; the stream embeddings random), so its main stream continues the AR draft's distillation."]


def _unlikelihood(c: dict) -> list[str]:
    """The target's unlikelihood fine-tuning, when the run had one (its time is not in the table's target row)."""
    u = c["training"].get("target_unlikelihood")
    if u is None:
        return []
    return ["", f"After the target row above, the target was fine-tuned for {u['seconds'] / 60:.1f} min ({u['steps']} "
                "updates, alternating): MLE updates on the corpus, and sequence-level unlikelihood updates (Welleck et "
                f"al., 2020) on its own greedy continuations ({c['config']['unlikelihood_new_tokens']} tokens after "
                "each training prompt), penalising −log(1 − p) on the tokens of repeated 4-grams."]


def _continuations(c: dict) -> list[str]:
    """The share of the drafts' distillation data that was the target's own text, when the run used one."""
    g = c["training"].get("continuations")
    if g is None:
        return []
    share = c["config"]["continuation_share"]
    return ["", f"The drafts' batches were {share:.0%} the target's own continuations ({g['sequences']:,} training "
                f"prompts of {g['prompt_tokens']} tokens, half continued greedily and half sampled at temperature 1; "
                f"{g['generated_tokens'] / 1e6:.2f} M generated tokens in {g['seconds'] / 60:.1f} min) and the rest "
                "corpus windows."]


def _continued(t: dict) -> list[str]:
    """A target trained in two runs (or kept from an earlier run) says so, with the earlier run's share."""
    if "continued_from" not in t:
        return []
    e = t.get("earlier")
    run = "" if e is None else (f"{e['steps']} steps, {e['tokens'] / 1e6:.2f} M tokens, "
                                f"{e['seconds'] / 60:.1f} min on {e['device']}")
    if t["steps"] == 0:
        kept = "" if e is None else f" (its training: {run})"
        return ["", f"The target is `--init-target {t['continued_from']}` unchanged{kept}; this run trained only "
                    "the drafts, initialised from and distilled from it."]
    earlier = "" if e is None else (f" after an earlier run of {run}; in all {e['steps'] + t['steps']} steps, "
                                    f"{(e['tokens'] + t['tokens']) / 1e6:.2f} M tokens, "
                                    f"{(e['seconds'] + t['seconds']) / 60:.1f} min")
    return ["", f"The target row above is its continued training (`--init-target {t['continued_from']}`){earlier}. "
                "The drafts were initialised from and distilled from the final target in this run."]


def _exit_section(c: dict) -> list[str]:
    le, kinds = c["exit_layer"], list(c["exit_overlap"])
    rows = [[f"{layer}{' (ℓ_e)' if int(layer) == le else ''}"] + [c["exit_overlap"][k][layer][kk] for k in kinds
                                                                   for kk in ("1", "4", "8")]
            for layer in c["exit_overlap"][kinds[0]]]
    header = ["exit after layer"] + [f"{k} top-{kk}" for k in kinds for kk in ("1", "4", "8")]
    return (["## Early exit (logit lens: final norm + tied head)", "",
             "Share of held-out positions whose final greedy token lies in the exit readout's top-k "
             f"(empirical Ω̂_κ with greedy targets). Trained with an auxiliary exit loss at ℓ_e = {le}.", ""]
            + _table(header, rows) + [""])


def _draft_section(c: dict) -> list[str]:
    kinds = list(c["val_loss"]["target"])
    rows = [[NAMES[m]] + [c["agreement_top1"][m][k] for k in kinds] for m in ("draft_ar", "draft_ss")]
    for j, per_kind in c["streams"].items():
        rows.append([f"SS stream {j} (token t+{1 + int(j)})"] + [per_kind[k]["agreement_with_target"] for k in kinds])
    lines = ["## Draft agreement with the target", "",
             "Top-1 agreement with the target's greedy token on held-out text (teacher-forced). Stream j at t is "
             "compared with the target's greedy token at t+j.", ""]
    lines += _table(["draft"] + kinds, rows) + [""]
    spf = c["generation"]["draft_ss"].get("self_speculation_tokens_per_forward")
    if spf is not None:
        lines += [f"SS draft self-verifying greedy decode: {spf:.2f} tokens per forward on the held-out prompts "
                  "(the draft checking its own lookahead; not the pair's τ).", ""]
    return lines


def _samples_section(c: dict) -> list[str]:
    gen, ref = c["generation"], c["generation"]["reference_repetition"]
    kinds = [k for k in ("code", "prose") if k in ref]
    rows = [[label] + [gen[key]["repeated_4gram_fraction"][k] for k in kinds] for key, label in NAMES.items()]
    rows.append([f"held-out text itself (prompts followed by their true next {gen['target']['new_tokens']} tokens)"]
                + [ref[k] for k in kinds])
    counts = ", ".join(f"{v} {k}" for k, v in gen["target"]["n_prompts"].items())
    lines = ["## Greedy samples", "",
             f"Greedy continuations of {gen['target']['new_tokens']} tokens from held-out prompts ({counts}), spread "
             "evenly over windows at every 512th token of the validation files. Repeated-4-gram share: the share "
             "of new tokens that complete a 4-gram already seen in prompt + continuation; a share far above the "
             "text's own means the greedy continuation loops.", ""]
    lines += _table(["model"] + [f"{k} repeated-4-gram share" for k in kinds], rows) + [""]
    for key, label in NAMES.items():
        for kind, s in gen[key]["samples"].items():
            lines += [f"### {label}, {kind} (`{s['prompt_source']}`, share {s['repeated_4gram_fraction']:.2f})", "",
                      "```", s["prompt"] + " ⟦" + s["continuation"] + "⟧", "```", ""]
    return lines


def _speculation_section(spec: dict) -> list[str]:
    if not spec:
        return ["## Speculative decoding", "", "Not measured for this bundle.", ""]
    st = spec["settings"]
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    rows = [[key, *(fmt(m[k]) for k in ("tau", "acceptance_rate", "hit_rate", "exit_overlap_top_kappa",
                                          "draft_tokens_per_forward", "output_equals_ar",
                                          "runs_that_fell_back_to_the_target"))]
            for key, m in spec.items() if key != "settings"]
    return (["## Speculative decoding (engine, greedy)", "",
             f"γ = {st['gamma']}, κ = {st['kappa']}, ℓ_e = N/2, {st.get('dtype', 'the calibrated dtype')}"
             f"{', the draft model alone (the context draft off)' if st.get('context_draft') is False else ''}, "
             f"{st['max_new_tokens']} new tokens on each of "
             f"{st['prompts']} held-out prompts; τ counts the correction/bonus token; Ω̂_κ excludes d_j "
             "(mirror_core/metrics.py). The inline lane used here rolls out every branch, so the hit rate is that of all κ(γ+1) candidates. Re-measure the whole card with `python -m training.toy_pair.evaluate DIR`.", ""]
            + _table(["draft/decoder", "τ", "α", "hit rate", "Ω̂_κ", "η̄ (draft tokens/forward)",
                      "output = ar", "draft-lane failures"], rows) + [""])


def render_markdown(c: dict) -> str:
    """The human-readable card; every number comes from the same dict as model_card.json."""
    m = c["corpus"]
    lines = ["# Mirror-SD Playground default model pair", "",
             "A small Llama-style target, an autoregressive (AR) draft and a Speculative-Streaming (SS) draft, "
             "trained offline by `python -m training.toy_pair`. They are toy models meant for demonstrating "
             "speculative decoding, not for writing useful code or text.", ""]
    lines += _models_section(c) + _exit_section(c) + _draft_section(c)
    lines += _speculation_section(c.get("speculation") or {})
    lines += [""] + _samples_section(c)
    rows = [[f"{split} {kind}", m["documents"][split][kind], f"{m['bytes'][split][kind]:,}"]
            for split in ("train", "val") for kind in ("code", "prose")]
    lines += ["## Corpus", "",
              f"Source {m['source']} (Python {m['python_version']}), split by document name hash; excluded "
              f"directories {', '.join(m['excluded_dirs'])}; files over {m['max_file_bytes']:,} bytes skipped.", ""]
    lines += _table(["split", "documents", "bytes"], rows)
    lines += ["", f"Prose upsampled {m['prose_train_upsample']}x in training; {m['train_tokens']:,} training tokens; "
              f"sha256 of the documents `{m['sha256']}`. Tokenizer: byte-level BPE, "
              f"vocab {m['tokenizer']['vocab_size']}, "
              f"only special token `{m['tokenizer']['special_tokens'][0]}` (bos/eos/pad/unk, document separator).", "",
              f"Total wall time including tokenizer and evaluation: {c['total_wall_seconds'] / 60:.1f} min. "
              "Full configuration in model_card.json.", ""]
    return "\n".join(lines)


def write(out_dir: str, c: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model_card.json"), "w") as f:
        json.dump(c, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "MODEL_CARD.md"), "w") as f:
        f.write(render_markdown(c))
