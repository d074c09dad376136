"""One training loop for the bundled target, AR draft and SS draft, run in that order under a wall-clock budget."""
import dataclasses
import itertools
import json
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm

from training import loop, precision
from training.toy_pair import build, data, evaluate, losses
from training.toy_pair.config import TrainConfig


@dataclass(frozen=True)
class PhaseStats:
    """What one model's training phase did, for the model card."""

    steps: int
    tokens: int
    seconds: float
    final_train_loss: float | None  # mean of the last ≤ 50 steps (None: no step)


def optimizer_for(model: torch.nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.AdamW:
    """AdamW; matrices (embedding included) decay, norm gains and stream embeddings do not."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.dim() >= 2 and not n.endswith("stream_embed")]
    rest = [p for n, p in named if p.dim() < 2 or n.endswith("stream_embed")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=cfg.betas)


def run_phase(name: str, model: torch.nn.Module, loss_fn: Callable, batches: Callable, cfg: TrainConfig,
              peak_lr: float, budget_s: float) -> PhaseStats:
    """Train until the phase's time (or step) budget is spent; always at least one step (training/loop.py).

    batches() returns the next batch, a tuple passed to loss_fn as its arguments: (inputs, next-token targets),
    both [B, T] int64 on cfg.device, for every phase but the target's unlikelihood one (unlikelihood_batches)."""
    # bf16 autocast and torch.compile each shorten a CPU step (measured: docs/TRAINING.md)
    amp = (lambda: torch.autocast(cfg.device, dtype=torch.bfloat16)) if cfg.precision == "bf16" else nullcontext
    compiled = torch.compile(loss_fn) if cfg.compile else loss_fn
    budget = loop.Budget(budget_s, peak_lr, cfg.warmup_steps, cfg.max_steps, cfg.grad_clip, min_steps=1)
    bar = tqdm(total=max(round(budget_s), 1), desc=name, unit="s", mininterval=1.0)
    tokens = 0

    def on_step(step: loop.Step) -> None:
        nonlocal tokens
        tokens += step.batch[0].numel()
        bar.set_postfix(step=step.number, loss=f"{float(step.loss):.3f}", refresh=False)
        bar.update(min(int(step.elapsed), bar.total) - bar.n)

    stats = loop.run(model, optimizer_for(model, cfg, peak_lr), (batches() for _ in itertools.count()),
                     lambda batch: (compiled(*batch), None), budget, amp, on_step)
    bar.close()
    model.eval()
    return PhaseStats(stats.steps, tokens, stats.seconds, stats.recent_loss)


@torch.no_grad()
def target_continuations(target, stream: torch.Tensor, cfg: TrainConfig, generator: torch.Generator,
                         batch_size: int = 128) -> torch.Tensor:
    """The target's own continuations [M, T+1] of M random training prompts of cfg.continuation_prompt_tokens:
    even rows greedy, odd rows sampled at temperature 1 (KV-cached decoding in fp32, not bf16 autocast, which
    was slower at this batch; measured: docs/TRAINING.md).

    Why: the engine scores a draft on the target's generated text, not on the corpus, and the two differ
    (a small target's greedy text repeats far more than the corpus does); distilling partly on that text
    (sequence-level KD; DistillSpec compares it with corpus and draft-generated data) trains the drafts on
    the contexts where they must agree with the target."""
    rows = []
    for start in tqdm(range(0, cfg.continuation_sequences, batch_size), desc="continuations", unit="batch"):
        b = min(batch_size, cfg.continuation_sequences - start)
        prompts, _ = data.sample_batch(stream, b, cfg.continuation_prompt_tokens, generator, cfg.device)  # [b, P]
        greedy = torch.arange(start, start + b, device=cfg.device) % 2 == 0  # [b]

        def next_ids(logits):  # [b, V] → [b]
            p_target = torch.softmax(logits.float(), dim=-1)  # [b, V]
            sampled = torch.multinomial(p_target.cpu(), 1, generator=generator)[:, 0].to(cfg.device)  # [b]
            return torch.where(greedy, logits.argmax(-1), sampled)
        rows.append(continue_rows(target, prompts, cfg.context + 1 - prompts.shape[1], next_ids).cpu())
    return torch.cat(rows)  # [M, T+1]


@torch.no_grad()
def continue_rows(target, prompts: torch.Tensor, new_tokens: int, next_ids: Callable) -> torch.Tensor:
    """prompts [B, P] continued by KV-cached decoding, next_ids(last logits [B, V]) → [B] choosing each
    token: [B, P + new_tokens]."""
    seq, step_in, cache = prompts, prompts, None
    for _ in range(new_tokens):
        out = target(step_in, cache=cache, use_cache=True)
        cache, step_in = out.cache, next_ids(out.logits[:, -1])[:, None]  # [B, 1]
        seq = torch.cat([seq, step_in], dim=1)  # [B, t+1]
    return seq


def batches_from(stream: torch.Tensor, continuations: torch.Tensor | None, cfg: TrainConfig,
                 generator: torch.Generator) -> Callable:
    """A phase's batches: round(continuation_share·B) rows from the continuations (when given), the rest
    random windows of the corpus stream."""
    n_cont = 0 if continuations is None else round(cfg.continuation_share * cfg.batch_size)

    def batches():
        x, y = data.sample_batch(stream, cfg.batch_size - n_cont, cfg.context, generator, cfg.device)  # [B-n, T]
        if not n_cont:
            return x, y
        pick = continuations[torch.randint(0, len(continuations), (n_cont,), generator=generator)]  # [n, T+1]
        pick = pick.long().to(cfg.device)
        return torch.cat([x, pick[:, :-1]]), torch.cat([y, pick[:, 1:]])  # [B, T] each
    return batches


def repeated_ngram_mask(seq: torch.Tensor, start: int, n: int = 4) -> torch.Tensor:
    """[B, L] bool: the tokens at positions ≥ start that lie in an n-gram already seen earlier in their row
    (the unlikelihood candidates; the repeated-4-gram share of the model card counts the n-grams' last tokens)."""
    mask = torch.zeros(seq.shape, dtype=torch.bool)
    for r, row in enumerate(seq.tolist()):
        for i, repeated in enumerate(evaluate.repeated_ngram_ends(row, n)):
            if repeated and i >= start:
                mask[r, max(start, i - n + 1): i + 1] = True
    return mask.to(seq.device)


def unlikelihood_batches(target, stream: torch.Tensor, cfg: TrainConfig, generator: torch.Generator) -> Callable:
    """Welleck et al.'s fine-tuning mix, alternating: a corpus batch (x, y, None) for the MLE loss, then the
    target's own greedy continuations of random training prompts with their repeated-4-gram tokens
    (x, y, penalize) for the unlikelihood loss. The continuations come from the target as it is at that step."""
    corpus = batches_from(stream, None, cfg, generator)
    prompt = cfg.continuation_prompt_tokens
    step = itertools.count()

    def batches():
        if next(step) % 2 == 0:
            return (*corpus(), None)
        prompts, _ = data.sample_batch(stream, cfg.batch_size, prompt, generator, cfg.device)  # [B, P]
        target.eval()
        seq = continue_rows(target, prompts, cfg.unlikelihood_new_tokens, lambda logits: logits.argmax(-1))  # [B, P+N]
        target.train()
        penalize = repeated_ngram_mask(seq, prompt)  # [B, P + N]
        return seq[:, :-1], seq[:, 1:], penalize[:, 1:]
    return batches


def target_loss_fn(target, cfg: TrainConfig) -> Callable:
    """Next-token CE plus the early-exit auxiliary loss at ℓ_e (logit lens: final norm + tied head)."""
    def loss_fn(x, y):
        out = target(x, output_hidden_states=True, use_cache=False)
        exit_logits = target.lm_head(target.model.norm(out.hidden_states[cfg.resolved_exit_layer]))  # [B, T, V]
        exit_term = losses.early_exit_loss(exit_logits, out.logits, y)
        return losses.next_token_loss(out.logits, y) + cfg.exit_loss_weight * exit_term
    return loss_fn


def target_unlikelihood_loss_fn(target, cfg: TrainConfig) -> Callable:
    """The target's loss (next-token CE + early exit) on corpus batches; sequence-level unlikelihood on its own
    greedy continuations (penalize given)."""
    mle = target_loss_fn(target, cfg)

    def loss_fn(x, y, penalize):
        if penalize is None:
            return mle(x, y)
        return losses.unlikelihood_loss(target(x, use_cache=False).logits, y, penalize)
    return loss_fn


def ar_draft_loss_fn(draft, target) -> Callable:
    """Forward-KL distillation of the AR draft from the frozen target."""
    def loss_fn(x, y):
        with torch.no_grad():
            target_logits = target(x, use_cache=False).logits  # [B, T, V]
        return losses.distill_loss(draft(x, use_cache=False).logits, target_logits)
    return loss_fn


def ss_draft_loss_fn(draft, target, cfg: TrainConfig) -> Callable:
    """SS loss with a distilled main stream (forward KL) and CE lookahead streams (α_j = stream_loss_weight)."""
    def loss_fn(x, y):
        with torch.no_grad():
            target_logits = target(x, use_cache=False).logits  # [B, T, V]
        out = draft(x)
        return losses.speculative_streaming_loss(out.logits, out.stream_logits, y, cfg.stream_loss_weight,
                                                 target_logits=target_logits)
    return loss_fn


def starting_point(cfg: TrainConfig, corpus: data.Corpus, generator: torch.Generator):
    """(tokenizer, target) to train: fresh ones, or with --init-target an earlier run's, to continue."""
    if cfg.init_target:
        from transformers import PreTrainedTokenizerFast

        from mirror_core.models.loading import ModelSpec, load_model

        tokenizer = PreTrainedTokenizerFast.from_pretrained(cfg.init_target)
        target = load_model(ModelSpec(cfg.init_target))  # float32 (a Q8_0 GGUF target dequantised, as it runs)
        if target.config.num_hidden_layers != cfg.target_layers or target.config.hidden_size != cfg.hidden_size:
            raise ValueError(f"--init-target {cfg.init_target} has a different shape than the flags ask for")
        return tokenizer, target.to(cfg.device)
    tokenizer = data.train_tokenizer(corpus, cfg.vocab_size)
    config = build.llama_config(len(tokenizer), tokenizer.convert_tokens_to_ids(data.EOT), cfg.hidden_size,
                                cfg.intermediate_size, cfg.target_layers, cfg.num_heads, cfg.num_kv_heads,
                                max_positions=4 * cfg.context)
    return tokenizer, build.make_target(config, generator).to(cfg.device)


def train_all(cfg: TrainConfig) -> dict:
    """Tokenizer → target → AR draft → SS draft → saved fp16 models → model card; returns the card dict."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.precision == "auto":  # measured at the run's threads; the card names what ran
        fast = cfg.device != "cpu" or precision.resolve("auto") == "bfloat16"
        cfg = dataclasses.replace(cfg, precision="bf16" if fast else "fp32")
    t_start = time.perf_counter()
    corpus = data.load_corpus(cfg.corpus_dir)
    gen_init = torch.Generator().manual_seed(cfg.seed)
    tokenizer, target = starting_point(cfg, corpus, gen_init)
    train_stream = data.token_stream(tokenizer, corpus.select("train"), corpus.manifest["prose_train_upsample"])
    # one data generator per phase, so a phase's batches do not depend on how many steps the previous one ran
    gen_data = [torch.Generator().manual_seed(cfg.seed + 1 + i) for i in range(3)]
    budget = [cfg.budget_minutes * 60 * share for share in cfg.budget_split]
    stats = train_target(target, train_stream, cfg, gen_data[0], budget[0])
    save_target(target, tokenizer, cfg, trained=budget[0] > 0)  # saved at once: hours of work
    target.requires_grad_(False).eval()
    continuations, extra = distillation_data(target, train_stream, cfg)
    stats |= train_drafts(target, tokenizer, train_stream, continuations, cfg, (gen_init, *gen_data[1:]), budget[1:])
    manifest = dict(corpus.manifest, train_tokens=len(train_stream),
                    tokenizer={"vocab_size": len(tokenizer), "special_tokens": [data.EOT]})
    card = evaluate.evaluate_bundle(cfg.out_dir, corpus, cfg)
    card.update(corpus=manifest, training=training_record(stats, extra, cfg), config=dataclasses.asdict(cfg),
                total_wall_seconds=time.perf_counter() - t_start)
    evaluate.write_model_card(cfg.out_dir, card)
    return card


def save_target(target, tokenizer, cfg: TrainConfig, trained: bool) -> None:
    """The trained target in fp16; an --init-target this run did not train, its own files as they are (a Q8_0 GGUF
    stays one, bit for bit)."""
    out = os.path.join(cfg.out_dir, "target")
    if trained or not cfg.init_target:
        build.save_fp16(target, tokenizer, out)
    elif os.path.abspath(cfg.init_target) != os.path.abspath(out):
        shutil.copytree(cfg.init_target, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.index.json"))


def train_target(target, train_stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator,
                 budget_s: float) -> dict[str, PhaseStats]:
    """The target's MLE phase, then its unlikelihood fine-tuning when asked for; none for a drafts-only run (the
    --init-target is kept as it is)."""
    if budget_s <= 0:
        return {"target": PhaseStats(steps=0, tokens=0, seconds=0.0, final_train_loss=None)}
    mle_s = budget_s * (1 - cfg.unlikelihood_share)
    stats = {"target": run_phase("target", target, target_loss_fn(target, cfg),
                                 batches_from(train_stream, None, cfg, gen), cfg, cfg.lr_target, mle_s)}
    if cfg.unlikelihood_share > 0:  # fine-tuning at the learning rate the MLE phase ended at (10% of peak)
        stats["target_unlikelihood"] = run_phase(
            "target_unlikelihood", target, target_unlikelihood_loss_fn(target, cfg),
            unlikelihood_batches(target, train_stream, cfg, torch.Generator().manual_seed(cfg.seed + 5)), cfg,
            0.1 * cfg.lr_target, budget_s - mle_s)
    return stats


def distillation_data(target, train_stream: torch.Tensor, cfg: TrainConfig) -> tuple[torch.Tensor | None, dict]:
    """The target's own continuations for the drafts' batches (None when continuation_share is 0), and their record
    for the card."""
    if cfg.continuation_share <= 0:
        return None, {}
    t0 = time.perf_counter()
    continuations = target_continuations(target, train_stream, cfg, torch.Generator().manual_seed(cfg.seed + 4))
    prompt = cfg.continuation_prompt_tokens
    return continuations, {"continuations": {"sequences": len(continuations), "prompt_tokens": prompt,
                                             "generated_tokens": len(continuations) * (cfg.context + 1 - prompt),
                                             "seconds": time.perf_counter() - t0}}


def train_drafts(target, tokenizer, train_stream: torch.Tensor, continuations: torch.Tensor | None, cfg: TrainConfig,
                 gens: tuple[torch.Generator, ...], budget_s: list[float]) -> dict[str, PhaseStats]:
    """The AR draft (from the target's first layers), then the SS draft (from the AR draft or the target), each
    distilled from the frozen target and saved in fp16. gens: the init generator, then each draft's data one."""
    gen_init, gen_ar, gen_ss = gens
    draft_ar = build.make_ar_draft(target, cfg.draft_layers).requires_grad_(True)
    stats = {"draft_ar": run_phase("draft_ar", draft_ar, ar_draft_loss_fn(draft_ar, target),
                                   batches_from(train_stream, continuations, cfg, gen_ar), cfg, cfg.lr_draft,
                                   budget_s[0])}
    build.save_fp16(draft_ar, tokenizer, os.path.join(cfg.out_dir, "draft_ar"))
    ss_source = draft_ar if cfg.ss_init == "ar_draft" else target  # the AR draft starts from the target itself
    draft_ss = build.make_ss_draft(ss_source, cfg.ss_layers, cfg.ss_msa_layers, cfg.num_streams, gen_init)
    draft_ss.requires_grad_(True)
    stats["draft_ss"] = run_phase("draft_ss", draft_ss, ss_draft_loss_fn(draft_ss, target, cfg),
                                  batches_from(train_stream, continuations, cfg, gen_ss), cfg, cfg.lr_draft,
                                  budget_s[1])
    build.save_fp16(draft_ss, tokenizer, os.path.join(cfg.out_dir, "draft_ss"))
    return stats


def training_record(stats: dict[str, PhaseStats], extra: dict, cfg: TrainConfig) -> dict:
    """The card's training record: each phase with the device and threads it ran on, the continuations, and for a
    continued target its earlier training (from that run's card, when it has one)."""
    training = {name: dict(dataclasses.asdict(s), device=cfg.device, threads=torch.get_num_threads())
                for name, s in stats.items()} | extra
    if cfg.init_target:
        prior = os.path.join(os.path.dirname(os.path.abspath(cfg.init_target)), "model_card.json")
        training["target"]["continued_from"] = cfg.init_target
        if os.path.exists(prior):
            with open(prior, encoding="utf-8") as f:
                training["target"]["earlier"] = json.load(f)["training"]["target"]
    return training
