"""The sources of the draft's wider training text (docs/TRAINING.md): what the target is asked, stage by stage.

Every source is one or two stages; a stage turns the previous stage's records into jobs (prompt ids + a temperature)
that chat_data.py answers with the target in batched, resumable shards:

- templated: every form × topic of chat_prompts (FORMS + MORE_FORMS + NEW_FORMS × TOPICS + NEW_TOPICS), greedy.
- sampled: every `sampled_every`-th templated prompt answered `samples` times at the temperatures in turn.
- self_questions: stage 1 asks the target for `questions` questions on each topic (sampled, so they differ);
  stage 2 answers every question parsed from those answers greedily. Stage 1's answers are training text too.
- multi_turn: stage 1 answers every `multi_turn_every`-th templated prompt greedily; stage 2 adds a follow-up user
  turn on that answer and answers it. Stage 2's records keep `answer_spans`: where the target's own tokens lie.
- code: functions from a description or a docstring, a bug to fix, code to explain (greedy).

Every user turn of every source passes chat_prompts.check_prompt (the held-out guard): the fixed tables fail loudly,
and a question the target wrote that mentions a held-out topic is dropped and counted (`refused`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from training.draft import chat_prompts as P
from training.precision import PRECISIONS

SOURCES = ("templated", "sampled", "self_questions", "multi_turn", "code")
TOPIC_PROMPTS = "topic_prompts"  # no --sources: chat_prompts.topic_prompts, flat in OUT (the held-out set's maker)
FEATURE_LAYER = 20   # ℓ_e of the default pair's feature draft: the layer whose hidden states generation records
TOPK = 32            # the target's next-token logits kept per answer position (the draft's soft targets)


@dataclass(frozen=True)
class DataConfig:
    """What chat_data generates and how (the CLI maps its flags here, in chat_data.main)."""
    out: str                                      # output folder: OUT/<source>/answers_*.pt + OUT/manifest.json
    target: str = "smollm2-135m-instruct"         # a prepared model name or a folder
    sources: tuple[str, ...] = ()                 # () = the topic-prompt set (chat_prompts.topic_prompts) into OUT
    batch: int = 128                              # rows answered together (left-padded) = jobs per shard
    new_tokens: int = 128                         # answer length limit
    threads: int = 0                              # torch threads (0: torch's default)
    dtype: str = "auto"                           # the target's weights while generating: precision.PRECISIONS
                                                  # (auto: bfloat16 where measured faster, else float32)
    limit: int = 0                                # only the first N jobs of each stage (0 = all)
    seed: int = 0                                 # every shard's sampler is seeded from it, the source and the shard
    samples: int = 2                              # sampled answers per prompt (source `sampled`)
    temperatures: tuple[float, ...] = (0.7, 1.0)  # used in turn by `sampled`; the first also by self_questions stage 1
    sampled_every: int = 2                        # `sampled` answers every N-th templated prompt
    questions: int = 5                            # questions asked for per topic and request (self_questions)
    multi_turn_every: int = 4                     # `multi_turn` continues every N-th templated prompt
    held_out: bool = False                        # topic-prompt set: the held-out topics' prompts (evaluation)
    more: bool = False                            # topic-prompt set: add MORE_FORMS
    only_more: bool = False                       # topic-prompt set: only the prompts MORE_FORMS adds
    temperature: float = 0.0                      # topic-prompt set: sample its answers at this temperature (0: greedy)
    feature_layer: int = FEATURE_LAYER            # record h^(ℓ) at every position (0: record no teacher figures)
    topk: int = TOPK                              # record the top-k next-token logits at every answer position

    def __post_init__(self):
        unknown = [s for s in self.sources if s not in SOURCES]
        if unknown:
            raise ValueError(f"unknown source(s) {unknown}: choose from {', '.join(SOURCES)}")
        if self.dtype not in PRECISIONS:
            raise ValueError(f"dtype must be one of {', '.join(PRECISIONS)}, not {self.dtype!r}")
        if min(self.batch, self.new_tokens, self.samples, self.questions, self.sampled_every,
               self.multi_turn_every) < 1 or self.limit < 0:
            raise ValueError("batch, new_tokens, samples, questions and the strides must be ≥ 1, limit ≥ 0")
        if self.feature_layer < 0 or self.topk < 1:
            raise ValueError("feature_layer must be ≥ 0 (0: record none) and topk ≥ 1")
        if not self.temperatures or not all(0.0 < t <= 2.0 for t in self.temperatures) or \
                not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperatures must lie in (0, 2] (the topic-prompt set's --temperature in [0, 2])")
        if self.sources and (self.held_out or self.more or self.only_more or self.temperature):
            raise ValueError("--held-out, --more, --only-more and --temperature choose the topic-prompt set: "
                             "leave them out with --sources")


@dataclass(frozen=True)
class Job:
    """One answer to generate."""
    prompt: tuple[int, ...]                       # token ids the target continues (chat template applied)
    temperature: float                            # 0: greedy; else sampled with the shard's generator
    meta: dict = field(default_factory=dict)      # kept in the record beside prompt and answer


@dataclass(frozen=True)
class StagePlan:
    """A stage's jobs and what building them counted (questions refused by the guard, unparsed answers)."""
    jobs: list[Job]
    notes: dict = field(default_factory=dict)


class ChatTokens:
    """The target's tokenizer as the sources need it: chats → prompt ids, answers → text, follow-up contexts."""

    def __init__(self, tok: Any):
        self.tok = tok

    def encode(self, messages: list[dict]) -> tuple[int, ...]:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tuple(self.tok(text).input_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def follow_up(self, user: str, answer: list[int], follow: str) -> tuple[tuple[int, ...], tuple[int, int]]:
        """The ids of [user, the target's answer, follow] ready for the next answer, and where the target's own
        answer tokens lie in them ([start, end), the eos excluded). The answer's ids are kept as generated (not
        re-tokenised); only the text after them comes from the chat template."""
        eos = self.tok.eos_token_id
        own = list(answer[:-1]) if answer and answer[-1] == eos else list(answer)
        first = self.tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                             tokenize=False)
        said = self.decode(own)
        full = self.tok.apply_chat_template([{"role": "user", "content": user}, {"role": "assistant", "content": said},
                                             {"role": "user", "content": follow}], add_generation_prompt=True,
                                            tokenize=False)
        if not full.startswith(first + said):
            raise ValueError("the chat template does not keep the assistant's text verbatim: multi-turn contexts "
                             "cannot reuse the target's answer ids")
        head = list(self.tok(first).input_ids)
        tail = self.tok(full[len(first + said):], add_special_tokens=False).input_ids
        return tuple(head + own + list(tail)), (len(head), len(head) + len(own))


def parse_questions(text: str, limit: int) -> list[str]:
    """The questions in a stage-1 answer: one per line or per '?', list markers stripped, 3–40 words, deduplicated,
    at most `limit`."""
    out, seen = [], set()
    for line in text.splitlines():
        for piece in re.split(r"(?<=\?)\s+", line):
            q = re.sub(r"^\s*(?:\d+\s*[.):]|[-*•]|Q\d*\s*[.:])\s*", "", piece).replace("**", "").strip()
            if q.endswith("?") and 3 <= len(q.split()) <= 40 and q.lower() not in seen:
                seen.add(q.lower())
                out.append(q)
    return out[:limit]


# -- the stages --------------------------------------------------------------------------------------------------
Stage = Callable[[ChatTokens, DataConfig, list[dict]], StagePlan]


def _asks(chat: ChatTokens, cfg: DataConfig, items: list[tuple[str, float, dict]]) -> list[Job]:
    """One-turn jobs from (user text, temperature, meta): every text through the held-out guard first (a table that
    names a held-out topic fails before any work), then only the first `limit` encoded."""
    for text, _, _ in items:
        P.check_prompt(text)
    return [Job(chat.encode([{"role": "user", "content": text}]), temp, {"user": [text], **meta})
            for text, temp, meta in items[: cfg.limit or None]]


def wide_prompts() -> list[str]:
    """Every form × topic of the wide set, in a fixed order."""
    forms = P.FORMS + P.MORE_FORMS + P.NEW_FORMS
    return [f.format(t=t) for t in P.TOPICS + P.NEW_TOPICS for f in forms]


def _templated(chat, cfg, _):
    return StagePlan(_asks(chat, cfg, [(p, 0.0, {}) for p in wide_prompts()]))


def _sampled(chat, cfg, _):
    temps = cfg.temperatures
    return StagePlan(_asks(chat, cfg, [(p, temps[(i * cfg.samples + k) % len(temps)], {})
                                       for i, p in enumerate(wide_prompts()[::cfg.sampled_every])
                                       for k in range(cfg.samples)]))


def _ask_questions(chat, cfg, _):
    return StagePlan(_asks(chat, cfg, [(r.format(n=cfg.questions, t=t), cfg.temperatures[0], {"topic": t})
                                       for t in P.TOPICS + P.NEW_TOPICS for r in P.QUESTION_REQUESTS]))


def _answer_questions(chat, cfg, earlier):
    asks, refused, unparsed = [], 0, 0
    for rec in earlier:
        found = parse_questions(chat.decode(rec["answer"]), cfg.questions)
        unparsed += not found
        for q in found:
            if P.held_out_mention(q) is None:
                asks.append((q, 0.0, {"topic": rec["topic"]}))
            else:
                refused += 1
    return StagePlan(_asks(chat, cfg, asks), {"refused": refused, "unparsed": unparsed, "questions": len(asks)})


def _first_turns(chat, cfg, _):
    return StagePlan(_asks(chat, cfg, [(p, 0.0, {}) for p in wide_prompts()[1::cfg.multi_turn_every]]))


def _follow_ups(chat, cfg, earlier):
    for follow in P.FOLLOW_UPS:  # the first turns passed the guard in stage 1
        P.check_prompt(follow)
    jobs = []
    for i, rec in enumerate(earlier[: cfg.limit or None]):
        follow = P.FOLLOW_UPS[i % len(P.FOLLOW_UPS)]
        ids, span = chat.follow_up(rec["user"][0], rec["answer"], follow)
        jobs.append(Job(ids, 0.0, {"user": rec["user"] + [follow], "first_answer": list(span)}))
    return StagePlan(jobs)


def code_prompts() -> list[str]:
    """Functions from a description or a docstring, bugs to fix, code to explain."""
    tasks = P.CODE_TOPICS + P.NEW_CODE_TOPICS
    snippets = [f'{sig}\n    """{doc}"""' for sig, doc in P.DOCSTRING_TASKS]
    return ([f.format(t=t) for t in tasks for f in P.CODE_FORMS + P.CODE_REQUESTS]
            + [f.format(code=c) for c in snippets for f in P.DOCSTRING_FORMS]
            + [f.format(code=c) for c in P.BUGGY_CODE for f in P.BUG_FORMS]
            + [f.format(code=c) for c in P.BUGGY_CODE + tuple(snippets) for f in P.EXPLAIN_FORMS])


def _code(chat, cfg, _):
    return StagePlan(_asks(chat, cfg, [(p, 0.0, {}) for p in code_prompts()]))


def _topic_prompts(chat, cfg, _):
    """chat_prompts.topic_prompts (the first drafts' data, and the held-out set): the guard is not applied here,
    since the held-out set is made of exactly those topics, and the training set's tables are checked by the tests."""
    chosen = P.topic_prompts(cfg.held_out, more=cfg.more or cfg.only_more)
    if cfg.only_more:
        before = set(P.topic_prompts(cfg.held_out))
        chosen = [p for p in chosen if p not in before]
    return StagePlan([Job(chat.encode([{"role": "user", "content": p}]), cfg.temperature, {"user": [p]})
                      for p in chosen[: cfg.limit or None]])


STAGES: dict[str, tuple[Stage, ...]] = {
    "templated": (_templated,), "sampled": (_sampled,), "self_questions": (_ask_questions, _answer_questions),
    "multi_turn": (_first_turns, _follow_ups), "code": (_code,), TOPIC_PROMPTS: (_topic_prompts,),
}


def answer_spans(job: Job, answer: list[int]) -> list[list[int]]:
    """Where the target's own tokens lie in prompt + answer ([start, end) pairs): the answer, and for a follow-up
    chat also the first answer inside the prompt."""
    first = [job.meta["first_answer"]] if "first_answer" in job.meta else []
    return first + [[len(job.prompt), len(job.prompt) + len(answer)]]

