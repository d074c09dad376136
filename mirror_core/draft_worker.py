"""The draft lane's work: prefill, fresh rollouts, branch-complete rollouts, and branch adoption.

A DraftWorker lives on the draft lane (its own process, thread, or inline) and sees only token
ids: the committed tokens it is told about, the early-exit candidates M_t, and (A_t, c).

Cache invariant between steps (docs/ALGORITHM.md §2.8): the draft cache holds a prefix of the committed tokens
through w0 (`committed` of them) followed by the window: after a model rollout all of them plus d1..d_{γ−1} (and d_γ
once bonus-slot branches have been prepared); after a context window (context_draft.py), which the draft model did
not roll out, possibly fewer, fed when the model next drafts.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from . import machine
from .config import FaultPlan, SamplingConfig
from .context_draft import ContextDrafter, ContextProposal
from .events import STAGE_DRAFT_BRANCHES, STAGE_DRAFT_ROLLOUT, STAGE_PREFILL, STAGE_SELECT_BRANCH
from .messages import (SOURCE_BRANCH, SOURCE_CONTEXT, SOURCE_MODEL, BranchRequest, DraftStart, DraftWindow,
                       ResolveRequest, SpanTuple, branch_rows)
from .runners.protocol import Runner
from .sampling import draft_sample


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
    adopts the branch the target lane's verdict names (a hit) or truncates to the committed prefix
    and rolls out γ fresh tokens (a miss), unless the context draft's window is modelled to do better
    (context_draft.py). It owns the draft cache and its own torch.Generator (seed + 1); it sees token
    ids only. `fault` is the test hook that makes it fail on purpose.
    """

    def __init__(self, runner: Runner, fault: FaultPlan = FaultPlan()):
        self.runner, self.fault = runner, fault
        self.cache = None
        self.req: DraftStart | None = None

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
        """The target lane's verdict: on a hit adopt branch (s_t = A_t + 1, c) as the next window, else roll out afresh."""
        bs, self.branch_set = self.branch_set, None
        branches = () if bs is None else tuple(tuple(r) for r in bs.tokens.tolist())
        new = list(self.window[: cmd.accepted]) + [cmd.token]  # what this step commits: d1..d_{A_t}, c
        row, proposal = None, None
        if self.context is not None:
            self.context.learn(self.proposal, len(self.window), cmd.accepted, cmd.verify_s, cmd.wait_s)
            self.context.index.extend(new)
            proposal = self.context.propose()
        if proposal is not None:
            self._take_context(cmd, proposal)
            source = SOURCE_CONTEXT
        elif cmd.hit:
            row = bs.rows.index((cmd.accepted, cmd.token))  # the target lane saw c among the candidates it sent
            with self._span(STAGE_SELECT_BRANCH):
                self.cache = self.runner.select_row(bs.cache, row)
            self.window = bs.tokens[row].tolist()
            self.p_window = None if bs.p_draft is None else bs.p_draft[row]
            source = SOURCE_BRANCH
        else:
            self._miss(cmd, new)
            source = SOURCE_MODEL
        self._advance(new, cmd, proposal is None)
        self.proposal = proposal
        reply = DraftWindow(tuple(self.window), self.p_window, row, branches, self.spans, self.forwards,
                            self.produced, source, proposal)
        self.spans, self.forwards, self.produced = [], 0, 0
        return reply

    def _start_window(self, req: DraftStart) -> None:
        """A request's window state: none yet, and the context draft when the request has it on."""
        self.window: list[int] = []
        self.p_window: torch.Tensor | None = None
        self.branch_set: _BranchSet | None = None
        self.spans: list[SpanTuple] = []
        self.forwards = self.produced = 0
        self.context = None if req.context is None else ContextDrafter(req.context, req.gamma)
        if self.context is not None:
            self.context.start(req.prompt_ids)
        self.proposal: ContextProposal | None = None

    def _take_context(self, cmd: ResolveRequest, proposal: ContextProposal) -> None:
        """The next window is the context's: the draft model rolls nothing out."""
        self._keep_committed(cmd)
        self.window = list(proposal.tokens)
        self.p_window = None if self.req.sampling.greedy else point_mass(proposal.tokens, self.runner.vocab_size)

    def _keep_committed(self, cmd: ResolveRequest) -> None:
        """Before a context window: the cache keeps the part of the committed tokens it already holds (a branch's
        cache is dropped); the rest is fed when the model next drafts."""
        self.runner.truncate(self.cache, min(self.runner.cache_len(self.cache), self.committed + cmd.accepted))

    def _miss(self, cmd: ResolveRequest, new: list[int]) -> None:
        with self._span(STAGE_DRAFT_ROLLOUT):
            self._fresh_rollout(cmd.accepted, cmd.token)

    def _advance(self, new: list[int], cmd: ResolveRequest, drafted: bool) -> None:
        """After the reply's window is set: the committed prefix grows by d1..d_{A_t} and c."""
        self.tokens += new
        self.committed += len(new)

    def _fresh_rollout(self, accepted: int, token: int) -> None:
        """Truncate to the committed prefix, feed what is missing plus c, draft γ tokens."""
        keep = min(self.runner.cache_len(self.cache), self.committed + accepted)
        self.runner.truncate(self.cache, keep)
        feed = (self.tokens + self.window)[keep: self.committed + accepted] + [token]
        step = self._ss_step if self.runner.num_streams else self._ar_step
        window, ps, lookahead = [], [], []
        while len(window) < self.req.gamma:
            emitted, p, lookahead = step(feed, lookahead)
            window += emitted
            ps += [] if p is None else list(p)
            feed = emitted[-1:]
        # The cache holds c, d1..d_{γ−1} after the committed prefix (an SS pass may have gone further).
        self.runner.truncate(self.cache, self.committed + accepted + self.req.gamma)
        self.window = window[: self.req.gamma]
        self.p_window = torch.stack(ps[: self.req.gamma]) if ps else None  # [γ, V]

    def _ar_step(self, feed: list[int], _lookahead: list[int]):
        logits = self.runner.forward(self.cache, feed)[-1:]                  # [1, V]
        ids, p = draft_sample(logits, self.req.sampling, self.gen)
        self._count(1, 1)
        return [int(ids[0])], p, []

    def _ss_step(self, feed: list[int], lookahead: list[int]):
        """One SS pass over feed + lookahead: verify the lookahead, emit, propose the next lookahead."""
        before = self.runner.cache_len(self.cache)
        main, streams = self.runner.forward_streams(self.cache, feed + lookahead)  # [T, V], [T, n, H]
        base = len(feed) - 1
        emitted, p = self_verify(main[base:], lookahead, self.req.sampling, self.gen)
        self.runner.truncate(self.cache, before + len(feed) + len(emitted) - 1)    # drop rejected lookahead
        self._count(len(emitted), 1)
        return emitted, p, self.runner.stream_proposals(streams[base + len(emitted) - 1]).tolist()

    # -- helpers ---------------------------------------------------------------------------
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


class FeatureDraftWorker(DraftWorker):
    """The draft lane's work for a feature-reading draft (models/feature_draft.py, runners/feature.py).

    Its cache entry i is (x_{i+1}, f_i): it holds one entry fewer than the committed tokens, and an entry is exact
    only once the target has computed f_i. So the prefill waits for the prompt's features (they come with
    ResolveRequest step 0), and every ResolveRequest carries the features of w0, d1..d_{A_t}: the draft drops its
    guessed entries back to `known` (entries from true features) and feeds (d1, f_w0) .. (c, f_{d_A}) before it
    rolls out γ tokens on its own predicted features. M_t carries all γ+1 slots' features: the branch batch first
    feeds (d1, f_w0) .. (d_γ, f_{d_{γ−1}}) once (the rows' shared prefix), then each row (j, v) starts at
    (v, f_{slot j}), so an adopted branch's entries up to c are exact and a fallback reuses the first A_t.
    """

    def _start(self, req: DraftStart) -> None:
        self.req = req
        self.gen = torch.Generator().manual_seed(req.sampling.seed + 1)
        self.cache = self.runner.new_cache()
        self.tokens: list[int] = list(req.prompt_ids)   # committed tokens (the window's drafts are not)
        self.known = 0                                  # cache entries built from the target's own features
        self.prefix = 0                                 # entries past `known` fed with true features (M_t's)
        self.pending: torch.Tensor | None = None        # [n, H] true features of entries known.. not fed yet
        self._start_window(req)                         # (entries of tokens committed while context windows ran)

    def _with_pending(self, features: torch.Tensor) -> torch.Tensor:
        """features [n, H] for the entries after the pending ones → [pending + n, H] from entry `known` on."""
        return features if self.pending is None else torch.cat([self.pending, features])

    def _branch(self, cmd: BranchRequest) -> None:
        with self._span(STAGE_DRAFT_BRANCHES):
            gamma, size = self.req.gamma, len(self.window)
            self.runner.truncate(self.cache, self.known)
            feed = self.tokens[self.known + 1:] + self.window                 # pending entries, then d1..d_L
            self.runner.forward(self.cache, feed, self._with_pending(cmd.features[:size]), rows=0)  # (d_{j+1}, f_j)
            self.known, self.pending, self.prefix = len(self.tokens) - 1, None, size
            self._count(0, 1)
            rows = branch_rows(cmd.topk_ids)
            if not rows:
                self.branch_set = None
                return
            bcache = self.runner.fork(self.cache, [self.known + j for j, _ in rows])
            ids = torch.tensor([v for _, v in rows], dtype=torch.long)                   # [R]
            feats = cmd.features[torch.tensor([j for j, _ in rows])]                     # [R, H]
            tokens, ps = [], []
            for _ in range(gamma):
                logits, feats = self.runner.forward_rows(bcache, ids, feats)             # [R, V_d+1], [R, H]
                ids, p = self._sample(logits)
                ids = ids.cpu()
                tokens.append(ids)
                ps.append(p)
                self._count(len(rows), len(rows))
            self.branch_set = _BranchSet(rows, torch.stack(tokens, 1),
                                         None if ps[0] is None else torch.stack(ps, 1), bcache)

    def _miss(self, cmd: ResolveRequest, new: list[int]) -> None:
        """Feed the entries the new features complete, then draft γ tokens on predicted features (at step 0: the
        prompt's entries, the draft's prefill)."""
        with self._span(STAGE_PREFILL if self.known == 0 else STAGE_DRAFT_ROLLOUT):
            features = self._with_pending(cmd.features)          # entries known.. (pending, then w0, d1..d_{A_t})
            keep = self.known + min(self.prefix, cmd.accepted)  # entries (d_{j+1}, f_j) already fed for accepted d's
            self.runner.truncate(self.cache, keep)
            tokens = self.tokens + new
            feed = tokens[keep + 1:]                             # x_{i+1} for entries keep..len(tokens)−2
            self._roll_out(self.runner.forward(self.cache, feed, features[keep - self.known:], rows=1))  # [1, V_d+1|H]

    def _keep_committed(self, cmd: ResolveRequest) -> None:
        """Nothing to cut: entries past `known` are brought up to date lazily (`pending`, then `_advance`)."""

    def _advance(self, new: list[int], cmd: ResolveRequest, drafted: bool) -> None:
        """A drafted window (rollout or branch) leaves every committed entry fed; a context window leaves the
        entries of d1..d_{A_t}, c pending (those M_t's features already fed stay: `prefix`)."""
        self.tokens += new
        if drafted:
            self.known, self.pending, self.prefix = len(self.tokens) - 1, None, 0
            return
        features = self._with_pending(cmd.features)                     # entries known..len(tokens)−2
        fed = min(self.prefix, len(features) - 1)                       # accepted drafts' entries fed with M_t
        self.known, self.pending, self.prefix = self.known + fed, features[fed:], 0

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens from logits over the draft's vocabulary [R, V_d+1]: target ids [R] and p_draft over the
        target's vocabulary [R, V] (None at T = 0), as draft_sample over the target's would give them."""
        ids, p = draft_sample(logits, self.req.sampling, self.gen)
        return self.runner.target_ids(ids), None if p is None else self.runner.over_target_vocab(p)

    def _roll_out(self, first: tuple[torch.Tensor, torch.Tensor]) -> None:
        """γ draft tokens from the last fed entry's outputs (logits [1, V_d+1], g [1, H]), each next on its predicted
        feature."""
        logits, g = first
        window, ps = [], []
        while True:
            ids, p = self._sample(logits)
            window.append(int(ids[0]))
            ps += [] if p is None else list(p)
            self._count(1, 1)                                 # one pass, one token
            if len(window) == self.req.gamma:
                break
            logits, g = self.runner.forward(self.cache, window[-1:], g)
        self.window = window
        self.p_window = torch.stack(ps) if ps else None                                  # [γ, V]


def point_mass(tokens: tuple[int, ...], vocab: int) -> torch.Tensor:
    """p_draft of a context window: each token with probability 1 ([L, V], one-hot), so that Rule R accepts d_j
    with probability p_target(d_j) and resamples from p_target without d_j: exactly the target's law."""
    p = torch.zeros(len(tokens), vocab)                                                  # [L, V]
    p[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return p


def worker_for(runner: Runner, fault: FaultPlan = FaultPlan()) -> DraftWorker:
    """The draft lane's worker for this runner: a feature-reading draft's own, else the token-only one."""
    return (FeatureDraftWorker if runner.reads_features else DraftWorker)(runner, fault)
