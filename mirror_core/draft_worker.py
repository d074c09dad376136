"""The draft lane's work: prefill, fresh rollouts, branch-complete rollouts, branch adoption, and each step's choice
of window (draft_choice.py). FeatureDraftWorker, a feature-reading draft's, is in draft_feature.py.

A DraftWorker lives on the draft lane (its own process, thread, or inline) and sees only token
ids: the committed tokens it is told about, the early-exit candidates M_t, and (A_t, c).

Cache invariant between steps (docs/ALGORITHM.md §2.8): the draft cache holds a prefix of the committed tokens
through w0 (`committed` of them) followed by the window: after a model rollout all of them plus d1..d_{γ−1} (and d_γ
once bonus-slot branches have been prepared; after an adopted branch cut to g < γ tokens, d_g.. too); after a window
the draft model did not roll out (a context copy, context_draft.py, or a window of zero), possibly fewer, fed in one
forward when the model next drafts.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from . import machine
from .config import FaultPlan, SamplingConfig
from .draft_choice import WindowChooser
from .events import STAGE_DRAFT_BRANCHES, STAGE_DRAFT_ROLLOUT, STAGE_PREFILL, STAGE_SELECT_BRANCH
from .messages import (SOURCE_BRANCH, SOURCE_MODEL, SOURCE_ZERO, BranchRequest, DraftStart, DraftWindow,
                       ResolveRequest, SpanTuple, branch_rows)
from .runners.protocol import Runner
from .sampling import argmax_last, draft_sample, probs


def self_verify(logits: torch.Tensor, lookahead: list[int], cfg: SamplingConfig, gen: torch.Generator | None
                ) -> tuple[list[int], torch.Tensor | None]:
    """SS self-verification: y_i from the main stream at each position (argmax, or a sample); keep
    lookahead tokens while they equal y_i, then emit the first y_i that differs (or the last one).

    Each emitted token is exactly a main-stream draw given the emitted prefix, so p_draft is the
    main stream's distribution there and greedy output equals one-token-at-a-time decoding.
    logits [T, V] with T = len(lookahead) + 1; returns emitted ids and their p_draft [E, V].
    """
    ys, p = draft_sample(logits, cfg, gen)                                  # [T], [T, V]
    emitted = []
    for i, y in enumerate(ys.tolist()):
        emitted.append(y)
        if i == len(lookahead) or lookahead[i] != y:
            break
    return emitted, None if p is None else p[: len(emitted)]


AGREE_ROWS = 8  # a catch-up forward runs the draft's head on at most this many rows before its last: agreement samples


class DraftFault(RuntimeError):
    """Injected failure of the draft lane (MIRROR_FAULT_DRAFT_AT_STEP)."""


@dataclass
class _BranchSet:
    rows: list[tuple[int, int]]       # (slot index 0..γ, candidate token) per row
    tokens: torch.Tensor              # [R, γ] branch tokens
    p_draft: torch.Tensor | None      # [R, γ, V]
    cache: object                     # the runner's forked branch cache


class DraftWorker:
    """The draft lane's decoding work for one request at a time, driven by the target lane's messages.

    DraftStart prefills the prompt and the first window follows at ResolveRequest(step 0); a
    BranchRequest (M_t) rolls out one γ-token branch per candidate as one batch; a ResolveRequest
    replies with the window its chooser values best (draft_choice.py): the branch the target lane's verdict
    names (a hit), g ≤ γ fresh tokens after truncating to the committed prefix, a context copy
    (context_draft.py), or none (a window of zero: the target takes a plain step). It owns the draft cache
    and its own torch.Generator (seed + 1); it sees token ids only. `fault` is the test hook that makes it
    fail on purpose.
    """

    def __init__(self, runner: Runner, fault: FaultPlan = FaultPlan()):
        self.runner, self.fault = runner, fault
        self.cache = None
        self.req: DraftStart | None = None
        self.asleep = False  # the lane waits for the next command asleep (DraftStart.shared): the target uses our cores

    def handle(self, cmd) -> DraftWindow | None:
        """Process one command; only ResolveRequest has a reply."""
        if isinstance(cmd, DraftStart):
            return self._start(cmd)
        self._maybe_fault(cmd.step)
        if isinstance(cmd, BranchRequest):
            return self._branch(cmd)
        return self._resolve(cmd)

    # -- commands --------------------------------------------------------------------------
    def _start(self, req: DraftStart) -> None:
        self.req = req
        self.gen = torch.Generator().manual_seed(req.sampling.seed + 1)  # the draft lane's own stream
        self.cache = self.runner.new_cache()
        self.tokens: list[int] = list(req.prompt_ids)  # committed tokens through w0
        self.committed = len(req.prompt_ids)   # tokens through w0 (the prompt's last token for now)
        self._start_window(req)
        with self._span(STAGE_PREFILL):
            self.runner.forward(self.cache, list(req.prompt_ids), rows=1)  # the cache is what is kept: one head row

    def _branch(self, cmd: BranchRequest) -> None:
        """Branch-complete rollouts: a γ-token continuation for every candidate, as one batch."""
        with self._span(STAGE_DRAFT_BRANCHES):
            have, need = self.runner.cache_len(self.cache), self.committed + len(self.window)
            if have < need:  # feed d_γ for the bonus slot's branches (after a context window: all it lacks)
                self.runner.forward(self.cache, (self.tokens + self.window)[have:need], rows=1)
                self._count(1, 1)
            rows = branch_rows(cmd.topk_ids)
            if not rows:
                self.branch_set = None
                return
            # Slot j+1's branches see the committed prefix through w0 plus d1..d_j.
            bcache = self.runner.fork(self.cache, [self.committed + j for j, _ in rows])
            first = torch.tensor([[v] for _, v in rows], dtype=torch.long)  # [R, 1]
            rollout = self._rows_streaming if self.runner.num_streams else self._rows_autoregressive
            tokens, p_draft = rollout(bcache, first)
            self.branch_set = _BranchSet(rows, tokens, p_draft, bcache)

    def _rows_autoregressive(self, bcache, ids: torch.Tensor):
        """γ batched one-token steps: feed v, b1..b_{γ−1}; returns tokens [R, γ] and p_draft [R, γ, V]."""
        tokens, ps = [], []
        for _ in range(self.req.gamma):
            logits, _ = self.runner.forward_rows(bcache, ids)               # [R, 1, V]
            next_ids, p = draft_sample(logits[:, -1], self.req.sampling, self.gen)
            tokens.append(next_ids.cpu())
            ps.append(p)
            ids = tokens[-1].unsqueeze(1)                                   # [R, 1]
            self._count(len(tokens[-1]), len(tokens[-1]))
        return torch.stack(tokens, 1), None if ps[0] is None else torch.stack(ps, 1)

    def _rows_streaming(self, bcache, ids: torch.Tensor):
        """SS rows: each batched pass verifies every row's lookahead and emits 1..n_str+1 tokens per row."""
        gamma, rows = self.req.gamma, ids.shape[0]
        start = bcache.positions.clone()
        out: list[list[int]] = [[] for _ in range(rows)]
        out_p: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        while min(len(o) for o in out) < gamma:
            main, streams = self.runner.forward_rows(bcache, ids)          # [R, T, V], [R, T, n, H]
            lookahead = ids[:, 1:].tolist()
            drop, last, at = [], [], []
            for r in range(rows):
                emitted, p = self_verify(main[r], lookahead[r], self.req.sampling, self.gen)
                out[r] += emitted
                if p is not None:
                    out_p[r] += list(p)
                drop.append(len(lookahead[r]) + 1 - len(emitted))          # rejected lookahead entries
                last.append(emitted[-1])
                at.append(len(emitted) - 1)                                # where the next lookahead is read
                self._count(len(emitted), 1)
            self.runner.rewind_rows(bcache, drop)
            proposals = self.runner.stream_proposals(streams[torch.arange(rows), torch.tensor(at)])  # [R, n]
            ids = torch.cat([torch.tensor(last).unsqueeze(1), proposals.cpu()], 1)  # [R, 1 + n_str]
        # Keep exactly v, b1..b_{γ−1} per row (the invariant for an adopted branch).
        self.runner.rewind_rows(bcache, [int(n) - gamma for n in (bcache.positions - start).tolist()])
        tokens = torch.tensor([o[:gamma] for o in out], dtype=torch.long)  # [R, γ]
        p_draft = torch.stack([torch.stack(p[:gamma]) for p in out_p]) if out_p[0] else None  # [R, γ, V]
        return tokens, p_draft

    def _resolve(self, cmd: ResolveRequest) -> DraftWindow:
        """The target lane's verdict and what it cost, then the next window the chooser values best (draft_choice.py):
        branch (s_t = A_t + 1, c) on a hit, a fresh rollout, a context copy, or none (a window of zero)."""
        bs, self.branch_set = self.branch_set, None
        branches = () if bs is None else tuple(tuple(r) for r in bs.tokens.tolist())
        new = list(self.window[: cmd.accepted]) + [cmd.token]  # what this step commits: d1..d_{A_t}, c
        if self.source in (SOURCE_MODEL, SOURCE_BRANCH):      # the model proposed at this step: not its agreement
            self.seen_upto = len(self.tokens) + len(new)
        self.chooser.learn(cmd.accepted, cmd.verify_s, cmd.wait_s, new)
        choice = self.chooser.choose(cmd.hit, self._fed(cmd))
        source, size, row = choice.chosen.source, choice.chosen.size, None
        t0 = time.perf_counter()
        if source == SOURCE_BRANCH:
            row = self._adopt(bs, cmd, size)
        elif source == SOURCE_MODEL:
            self._miss(cmd, size)
        else:
            self._take_copy(cmd, () if self.chooser.proposal is None else self.chooser.proposal.tokens)
        self.chooser.work_s = time.perf_counter() - t0
        self._advance(new, cmd, source in (SOURCE_MODEL, SOURCE_BRANCH))
        self.source = source
        self.asleep = self.req.shared == "all" or (self.req.shared == "plain" and source == SOURCE_ZERO)
        promise = self.chooser.promise
        reply = DraftWindow(tuple(self.window), self.p_window, row, branches, self.spans, self.forwards,
                            self.produced, source, self.chooser.proposal, choice,
                            None if promise is None else tuple(sorted(promise)))
        self.spans, self.forwards, self.produced = [], 0, 0
        return reply

    def _start_window(self, req: DraftStart) -> None:
        """A request's window state: none yet, and its window chooser (with the context draft when it is on)."""
        self.window: list[int] = []
        self.p_window: torch.Tensor | None = None
        self.branch_set: _BranchSet | None = None
        self.spans: list[SpanTuple] = []
        self.forwards = self.produced = 0
        self.chooser = WindowChooser(req.choice, req.gamma, req.prompt_ids)
        self.asleep = req.shared == "all"           # wait for the next command asleep: the target uses our cores
        self.source: str | None = None              # where the last window came from
        self.seen_upto = len(req.prompt_ids)        # committed tokens from here on were committed without the model

    def _adopt(self, bs: _BranchSet, cmd: ResolveRequest, size: int) -> int:
        """Adopt branch (s_t, c), the target lane saw c among the candidates it sent; its first `size` tokens."""
        row = bs.rows.index((cmd.accepted, cmd.token))
        with self._span(STAGE_SELECT_BRANCH):
            self.cache = self.runner.select_row(bs.cache, row)
        self.window = bs.tokens[row, :size].tolist()
        self.p_window = None if bs.p_draft is None else bs.p_draft[row, :size]
        return row

    def _take_copy(self, cmd: ResolveRequest, tokens: tuple[int, ...]) -> None:
        """A window the draft model rolls nothing out for: a context copy, or a window of zero (no tokens)."""
        self._keep_committed(cmd)
        self.window = list(tokens)
        self.p_window = None if self.req.sampling.greedy or not tokens else point_mass(tokens, self.runner.vocab_size)

    def _keep_committed(self, cmd: ResolveRequest) -> None:
        """Before a window the model did not roll out: the cache keeps the part of the committed tokens it already
        holds (a branch's cache is dropped); the rest is fed when the model next drafts."""
        self.runner.truncate(self.cache, min(self.runner.cache_len(self.cache), self.committed + cmd.accepted))

    def _fed(self, cmd: ResolveRequest) -> int:
        """Rows a fresh rollout would feed now: the committed tokens the cache lacks, and c (the token draft prefilled
        the prompt at DraftStart)."""
        return self.committed + cmd.accepted + 1 - min(self.runner.cache_len(self.cache), self.committed + cmd.accepted)

    def _miss(self, cmd: ResolveRequest, size: int) -> None:
        with self._span(STAGE_DRAFT_ROLLOUT):
            self._fresh_rollout(cmd.accepted, cmd.token, size)

    def _advance(self, new: list[int], cmd: ResolveRequest, drafted: bool) -> None:
        """After the reply's window is set: the committed prefix grows by d1..d_{A_t} and c."""
        self.tokens += new
        self.committed += len(new)

    def _fresh_rollout(self, accepted: int, token: int, size: int) -> None:
        """Truncate to the committed prefix, feed what is missing plus c (one forward), draft `size` tokens."""
        keep = min(self.runner.cache_len(self.cache), self.committed + accepted)
        self.runner.truncate(self.cache, keep)
        feed = (self.tokens + self.window)[keep: self.committed + accepted] + [token]
        fed, step = len(feed), self._ss_step if self.runner.num_streams else self._ar_step
        window, ps, lookahead, times = [], [], [], [time.perf_counter()]
        while len(window) < size:
            emitted, p, lookahead = step(feed, lookahead, keep)
            window += emitted
            ps += [] if p is None else list(p)
            feed = emitted[-1:]
            times.append(time.perf_counter())
        self.chooser.costs.learn_rollout(fed, times[1] - times[0], len(times) - 2, times[-1] - times[1])
        # The cache holds c, d1..d_{size−1} after the committed prefix (an SS pass may have gone further).
        self.runner.truncate(self.cache, self.committed + accepted + size)
        self.window = window[:size]
        self.p_window = torch.stack(ps[:size]) if ps else None  # [size, V]

    def _ar_step(self, feed: list[int], _lookahead: list[int], at: int):
        """One forward over feed (the first at cache position `at`), the head on its last AGREE_ROWS + 1 rows: the
        draft's agreement samples, then the next token."""
        rows = min(len(feed), AGREE_ROWS + 1)
        logits = self.runner.forward(self.cache, feed, rows=rows)            # [rows, V]
        first = len(feed) - rows + 1                                         # the feed index the first row predicts
        self._agree(logits[:-1], feed[first:], at + first)
        ids, p = draft_sample(logits[-1:], self.req.sampling, self.gen)
        self._count(1, 1)
        return [int(ids[0])], p, []

    def _ss_step(self, feed: list[int], lookahead: list[int], _at: int):
        """One SS pass over feed + lookahead: verify the lookahead, emit, propose the next lookahead."""
        before = self.runner.cache_len(self.cache)
        main, streams = self.runner.forward_streams(self.cache, feed + lookahead)  # [T, V], [T, n, H]
        base = len(feed) - 1
        emitted, p = self_verify(main[base:], lookahead, self.req.sampling, self.gen)
        self.runner.truncate(self.cache, before + len(feed) + len(emitted) - 1)    # drop rejected lookahead
        self._count(len(emitted), 1)
        return emitted, p, self.runner.stream_proposals(streams[base + len(emitted) - 1]).tolist()

    # -- helpers ---------------------------------------------------------------------------
    def _agree(self, logits: torch.Tensor, actual: list[int], first: int) -> None:
        """Tell the chooser how the draft agrees with tokens the target committed without it: logits [T, V] row r
        predicted actual[r], the committed token at position first + r; tokens of the model's own steps are left out
        (their outcome is counted already)."""
        skip = max(0, self.seen_upto - first)
        if skip < len(actual):
            self.chooser.agree(agreement(logits[skip:len(actual)], actual[skip:], self.req.sampling))

    def _count(self, tokens: int, row_forwards: int) -> None:
        """η̄ bookkeeping: draft tokens produced per row-forward (1 for an AR draft)."""
        self.produced += tokens
        self.forwards += row_forwards

    def _maybe_fault(self, step: int) -> None:
        if self.fault.at_step is not None and step >= self.fault.at_step:
            if self.fault.mode == "exit":
                os._exit(3)
            raise DraftFault(f"injected draft-lane fault at step {step}")

    def _span(self, stage: str):
        return _Span(self, stage)


class _Span:
    def __init__(self, worker: DraftWorker, stage: str):
        self.worker, self.stage = worker, stage

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        machine.synchronize(self.worker.runner.device)  # the draft lane's own stream only
        self.worker.spans.append((self.stage, self.t0, time.perf_counter()))
        return False


def point_mass(tokens: tuple[int, ...], vocab: int) -> torch.Tensor:
    """p_draft of a context window: each token with probability 1 ([L, V], one-hot), so that Rule R accepts d_j
    with probability p_target(d_j) and resamples from p_target without d_j: exactly the target's law."""
    p = torch.zeros(len(tokens), vocab)                                                  # [L, V]
    p[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return p


def agreement(logits: torch.Tensor, actual: list[int], cfg: SamplingConfig) -> list[float]:
    """p_draft of each committed token, rows of logits [T, V] (1 or 0 at T = 0): the acceptance a 1-token window
    would have had (its expectation under Rule E; a lower bound under Rule R)."""
    ids = torch.tensor(actual, dtype=torch.long)                                         # [T]
    if cfg.greedy:
        return (argmax_last(logits) == ids).float().tolist()
    return probs(logits, cfg).gather(-1, ids.unsqueeze(1)).squeeze(1).tolist()


