"""Sequence-level distillation data: the target's own chat answers, generated in batches, in resumable shards.

    python -m training.draft.chat_data --sources templated,sampled,self_questions,multi_turn,code --out OUT
    python -m training.draft.chat_data --more --out DIR              # the topic-prompt set (the first drafts' data)
    python -m training.draft.chat_data --held-out --more --limit 96 --out DIR   # held-out answers (evaluation)

With --sources each source (chat_sources.py) writes OUT/<source>/answers_s<stage>_<shard>.pt and OUT/<source>/
generation.json (tokens, records and seconds per shard), and OUT/manifest.json sums them per source; without it the
topic-prompt set (chat_prompts.topic_prompts: instruction forms × the training topics, or with --held-out the
held-out topics: the evaluation set) writes DIR/answers_<shard>.pt and DIR/generation.json. A shard is a list of records {"prompt": [ids],
"answer": [ids], "answer_spans": [[start, end), …] over prompt + answer (where the target's own tokens lie), "source",
"stage", "temperature", "user": [the user turns], and what the target computed on the way (feature_distill's teacher
pass, recorded instead of recomputed; --feature-layer 0 records none): "feat_layer" ℓ, "feat" [L − 1, H] bfloat16
(the hidden state after layer ℓ at positions 0 … L − 2), "top_ids" / "top_logits" [len(answer), k] (the top-k
next-token logits before each answer token, before any row samples)}; the answer ends with the eos token unless it
hit the limit.
A shard that exists is never made again, so a stopped run continues where it stopped (`--out` the same).
Generation runs the target in the dtype precision.py measures faster here (or --dtype bfloat16 / float32; the
records and the manifest keep the one that ran) with left padding (Hugging Face generate); sampled rows
draw from one torch.Generator per shard, seeded from --seed, the source, the stage and the shard.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time
import zlib
from dataclasses import dataclass, replace

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from training.draft.chat_sources import SOURCES, STAGES, TOPIC_PROMPTS, ChatTokens, DataConfig, Job, answer_spans
from training.precision import PRECISIONS, resolve


class RowSampler(LogitsProcessor):
    """Each row with a temperature > 0 draws its token (from the explicit generator) and keeps only that one, so
    greedy generate takes it; rows at temperature 0 stay greedy. Rows of one batch may differ in temperature."""

    def __init__(self, temperatures: torch.Tensor, generator: torch.Generator):
        self.temperatures = temperatures                                   # [rows] float32
        self.rows = temperatures > 0                                       # [rows] bool
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.rows.any():
            return scores
        probs = torch.softmax(scores[self.rows].float() / self.temperatures[self.rows, None], dim=-1)  # [n, V]
        cdf = probs.cumsum(-1)                                                                         # [n, V]
        total = cdf[:, -1:]                                                                            # [n, 1]
        u = torch.minimum(torch.rand(len(cdf), 1, generator=self.generator) * total,  # below the total: rounding
                          torch.nextafter(total, torch.zeros(())))                    # must not pick past the end
        pick = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1)  # [n, 1]: the inverse CDF
        # (a tenth of torch.multinomial's time over a 49,152-token vocabulary: 18 against 204 ms for 128 rows)
        only = torch.full_like(scores[self.rows], float("-inf")).scatter_(1, pick, 0.0)
        out = scores.clone()
        out[self.rows] = only
        return out


class TopK(LogitsProcessor):
    """Records each step's top-k next-token logits (the target's own, before any row samples) and changes nothing."""

    def __init__(self, k: int):
        self.k = k
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []               # per step: ids [rows, k], logits

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = scores.float().topk(self.k, dim=-1)                               # [rows, k]
        self.steps.append((top.indices.int(), top.values.half()))
        return scores


@dataclass(frozen=True)
class Answer:
    """One generated answer and what the target computed on the way (the teacher pass's figures, for free)."""
    ids: list[int]                        # the answer, cut after its eos
    feat: torch.Tensor | None             # [len(prompt) + len(ids) − 1, H] bf16: h^(ℓ) at positions 0 … L−2
    top_ids: torch.Tensor | None          # [len(ids), k] int32: the target's top-k next tokens before each answer token
    top_logits: torch.Tensor | None       # [len(ids), k] float16: their logits


class Target:
    """The target model and its tokenizer, answering a batch of jobs; it records the hidden state after layer
    `feature_layer` at every position and the top-`topk` logits before every answer token (what feature_distill's
    teacher pass would compute again) unless feature_layer is 0."""

    def __init__(self, cfg: DataConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mirror_core.models.prepared import resolve_source
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        folder = resolve_source(cfg.target)
        tok = AutoTokenizer.from_pretrained(folder)
        if tok.chat_template is None:
            raise SystemExit(f"{cfg.target}: the tokenizer has no chat template (chat_data needs an instruct target)")
        self.chat = ChatTokens(tok)
        self.dtype = resolve(cfg.dtype)                  # the dtype that runs ("auto" resolved here)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, self.dtype)).eval()
        self.eos = tok.eos_token_id
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else (self.eos if self.eos is not None else 0)
        self.new_tokens = cfg.new_tokens
        self.feature_layer, self.topk = cfg.feature_layer, cfg.topk
        layers = self.model.config.num_hidden_layers
        if not 0 <= self.feature_layer < layers:  # the last layer's hidden state is read after the final norm
            raise SystemExit(f"--feature-layer {self.feature_layer}: choose one of the target's layers 1..{layers - 1} "
                             "(0: record none)")

    @torch.inference_mode()
    def answer(self, jobs: list[Job], generator: torch.Generator) -> list[Answer]:
        """Each job's answer (cut after its eos) and its recorded features and logits, all jobs in one left-padded
        batch."""
        width = max(len(j.prompt) for j in jobs)
        ids = torch.full((len(jobs), width), self.pad, dtype=torch.long)          # [rows, width]
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for r, j in enumerate(jobs):
            ids[r, width - len(j.prompt):] = torch.tensor(j.prompt)
            mask[r, width - len(j.prompt):] = 1
        sampler = RowSampler(torch.tensor([j.temperature for j in jobs], dtype=torch.float32), generator)
        topk = TopK(self.topk)
        feats: list[torch.Tensor] = []                        # prefill [rows, width, H], then [rows, 1, H] a step
        hook = None
        if self.feature_layer:
            layer = self.model.model.layers[self.feature_layer - 1]
            hook = layer.register_forward_hook(
                lambda _m, _i, out: feats.append((out[0] if isinstance(out, tuple) else out).to(torch.bfloat16)))
        try:
            processors = [topk, sampler] if self.feature_layer else [sampler]
            gen = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.new_tokens,
                                      do_sample=False, pad_token_id=self.pad, eos_token_id=self.eos,
                                      logits_processor=LogitsProcessorList(processors))
        finally:
            if hook is not None:
                hook.remove()
        feat = torch.cat(feats, dim=1) if feats else None     # [rows, width + steps − 1, H]: column c = position
        top_ids = torch.stack([i for i, _ in topk.steps], 1) if topk.steps else None   # [rows, steps, k]
        top_logits = torch.stack([v for _, v in topk.steps], 1) if topk.steps else None
        out = []
        for r, (j, row) in enumerate(zip(jobs, gen[:, width:].tolist())):
            a = row[: row.index(self.eos) + 1] if self.eos in row else row
            if feat is None:
                out.append(Answer(a, None, None, None))
                continue
            first = width - len(j.prompt)                      # the prompt's first column
            out.append(Answer(a, feat[r, first: width + len(a) - 1].clone(), top_ids[r, : len(a)].clone(),
                              top_logits[r, : len(a)].clone()))
        return out


def _save(obj, path: str) -> None:
    """Write then rename: a stopped run never leaves half a shard (or half a record) behind; the temporary name is
    the process's own, so two runs on disjoint sources may share the manifest."""
    tmp = f"{path}.{os.getpid()}.tmp"
    if path.endswith(".json"):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
    else:
        torch.save(obj, tmp)
    os.replace(tmp, path)


def _record(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "generation.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"shards": {}, "notes": {}}


def _note_shard(folder: str, cfg: DataConfig, name: str, rows: list[dict], seconds: float) -> dict:
    """Add one shard's counts to the folder's generation.json (totals = sums over its shards, whichever run)."""
    rec = _record(folder)
    rec["shards"][name] = {"records": len(rows), "answer_tokens": sum(len(r["answer"]) for r in rows),
                           "seconds": round(seconds, 2), "threads": torch.get_num_threads(), "batch": cfg.batch,
                           "dtype": cfg.dtype}
    shards = rec["shards"].values()
    rec.update(records=sum(s["records"] for s in shards), answer_tokens=sum(s["answer_tokens"] for s in shards),
               seconds=round(sum(s["seconds"] for s in shards), 1), batch=cfg.batch,
               threads=torch.get_num_threads(), dtype=cfg.dtype, new_tokens=cfg.new_tokens)
    _save(rec, os.path.join(folder, "generation.json"))
    return rec


def _shard_seed(cfg: DataConfig, source: str, stage: int, shard: int) -> int:
    return zlib.crc32(f"{cfg.seed}/{source}/{stage}/{shard}".encode())


def run_stage(target: Target, cfg: DataConfig, source: str, stage: int, earlier: list[dict],
              keep: bool = False) -> list[dict]:
    """Answer one stage's jobs shard by shard (skipping shards that exist); return all its records if `keep`
    (the next stage is built from them)."""
    folder = os.path.join(cfg.out, source) if cfg.sources else cfg.out
    os.makedirs(folder, exist_ok=True)
    plan = STAGES[source][stage - 1](target.chat, cfg, earlier)
    jobs = sorted(plan.jobs[: cfg.limit or None], key=lambda j: len(j.prompt))  # similar lengths: less padding
    rec = _record(folder)
    rec["notes"][str(stage)] = {"jobs": len(jobs), **plan.notes}
    _save(rec, os.path.join(folder, "generation.json"))
    prefix = f"answers_s{stage}_" if cfg.sources else "answers_"
    for n, b in enumerate(range(0, len(jobs), cfg.batch)):
        path = os.path.join(folder, f"{prefix}{n:04d}.pt")
        if os.path.exists(path):
            continue
        chunk = jobs[b: b + cfg.batch]
        t0 = time.perf_counter()
        answers = target.answer(chunk, torch.Generator().manual_seed(_shard_seed(cfg, source, stage, n)))
        seconds = time.perf_counter() - t0
        rows = [_row(j, a, source, stage, target.feature_layer) for j, a in zip(chunk, answers)]
        _save(rows, path)
        total = _note_shard(folder, cfg, os.path.basename(path), rows, seconds)
        tokens = total["shards"][os.path.basename(path)]["answer_tokens"]
        print(f"{path}: {len(rows)} answers, {tokens} answer tokens, {tokens / seconds:.0f} tok/s "
              f"({total['answer_tokens']} in this folder)", flush=True)
        if cfg.sources:
            write_manifest(cfg)
    if not keep:
        return []
    return [r for p in sorted(glob.glob(os.path.join(folder, f"{prefix}[0-9]*.pt"))) for r in torch.load(p, mmap=True)]


def _row(job: Job, a: Answer, source: str, stage: int, feature_layer: int) -> dict:
    """One record: the job's prompt and meta, the answer, where the target's own tokens lie, and (where recorded) the
    teacher's figures: feat [L − 1, H] after layer `feat_layer`, top_ids / top_logits [len(answer), k]."""
    row = {**{k: v for k, v in job.meta.items() if k != "first_answer"}, "prompt": list(job.prompt), "answer": a.ids,
           "answer_spans": answer_spans(job, a.ids), "source": source, "stage": stage, "temperature": job.temperature}
    if a.feat is not None:
        row |= {"feat_layer": feature_layer, "feat": a.feat, "top_ids": a.top_ids, "top_logits": a.top_logits}
    return row


def write_manifest(cfg: DataConfig) -> dict:
    """OUT/manifest.json: per source, the answer tokens, records and seconds its shards took (every run's), and the
    machine they were made on."""
    from mirror_core.machine import cpu_model

    records = {s: _record(os.path.join(cfg.out, s)) for s in SOURCES if os.path.isdir(os.path.join(cfg.out, s))}
    per = {s: {k: r.get(k, 0) for k in ("answer_tokens", "records", "seconds")} | {"notes": r["notes"]}
           for s, r in records.items()}
    ran = sorted({shard.get("dtype", "") for r in records.values() for shard in r["shards"].values()})
    manifest = {"target": cfg.target, "cpu": cpu_model(), "threads": torch.get_num_threads(), "batch": cfg.batch,
                "dtype": ",".join(ran) or cfg.dtype, "new_tokens": cfg.new_tokens, "sources": per,  # every shard's
                "answer_tokens": sum(p["answer_tokens"] for p in per.values()),
                "seconds": round(sum(p["seconds"] for p in per.values()), 1)}
    _save(manifest, os.path.join(cfg.out, "manifest.json"))
    return manifest


def generate(cfg: DataConfig) -> None:
    """Every chosen source, stage by stage (the topic-prompt set when no source is chosen)."""
    target = Target(cfg)
    cfg = replace(cfg, dtype=target.dtype)  # the records and the manifest name the dtype that ran
    for source in cfg.sources or (TOPIC_PROMPTS,):
        earlier: list[dict] = []
        stages = len(STAGES[source])
        for stage in range(1, stages + 1):
            earlier = run_stage(target, cfg, source, stage, earlier, keep=stage < stages)
    if cfg.sources:
        m = write_manifest(cfg)
        print(f"{cfg.out}/manifest.json: {m['answer_tokens']} answer tokens in {m['seconds'] / 60:.1f} min "
              f"({m['cpu']}, {m['threads']} threads)", flush=True)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def main(argv: list[str] | None = None) -> None:
    d = {f: DataConfig.__dataclass_fields__[f].default for f in DataConfig.__dataclass_fields__ if f != "out"}
    parser = argparse.ArgumentParser(prog="python -m training.draft.chat_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default=d["target"])
    parser.add_argument("--sources", default="", help=f"comma-separated, from {','.join(SOURCES)} (none: the topic-prompt set)")
    parser.add_argument("--batch", type=int, default=d["batch"], help="rows answered together = jobs per shard")
    parser.add_argument("--new-tokens", type=int, default=d["new_tokens"])
    parser.add_argument("--threads", type=int, default=d["threads"])
    parser.add_argument("--dtype", default=d["dtype"], choices=PRECISIONS,
                        help="the target's dtype while generating (auto: bfloat16 where measured faster here)")
    parser.add_argument("--limit", type=int, default=d["limit"], help="only the first N jobs of each stage (0 = all)")
    parser.add_argument("--seed", type=int, default=d["seed"])
    parser.add_argument("--samples", type=int, default=d["samples"], help="sampled answers per prompt (sampled)")
    parser.add_argument("--temperatures", default=",".join(map(str, d["temperatures"])),
                        help="sampling temperatures, used in turn (sampled; the first: self_questions' stage 1)")
    parser.add_argument("--sampled-every", type=int, default=d["sampled_every"])
    parser.add_argument("--questions", type=int, default=d["questions"], help="questions per request (self_questions)")
    parser.add_argument("--multi-turn-every", type=int, default=d["multi_turn_every"])
    parser.add_argument("--held-out", action="store_true", help="topic-prompt set: the held-out topics' prompts")
    parser.add_argument("--more", action="store_true", help="topic-prompt set: add chat_prompts.MORE_FORMS")
    parser.add_argument("--only-more", action="store_true", help="topic-prompt set: only the prompts MORE_FORMS adds")
    parser.add_argument("--temperature", type=float, default=d["temperature"],
                        help="topic-prompt set: sample its answers at this temperature (0: greedy)")
    parser.add_argument("--feature-layer", type=int, default=d["feature_layer"],
                        help="record the hidden state after this layer at every position (0: none)")
    parser.add_argument("--topk", type=int, default=d["topk"], help="record the top-k logits per answer position")
    a = parser.parse_args(argv)
    try:
        cfg = DataConfig(out=a.out, target=a.target, sources=tuple(s for s in a.sources.split(",") if s),
                         batch=a.batch, new_tokens=a.new_tokens, threads=a.threads, dtype=a.dtype, limit=a.limit,
                         seed=a.seed, samples=a.samples, temperatures=_floats(a.temperatures),
                         sampled_every=a.sampled_every, questions=a.questions, multi_turn_every=a.multi_turn_every,
                         held_out=a.held_out, more=a.more, only_more=a.only_more, temperature=a.temperature,
                         feature_layer=a.feature_layer, topk=a.topk)
    except ValueError as e:
        parser.error(str(e))
    generate(cfg)


if __name__ == "__main__":
    main()
