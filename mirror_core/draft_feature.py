"""The draft lane's work for a feature-reading draft (models/feature_draft.py, runners/feature.py), and the choice of
worker for a draft lane's runner."""
from __future__ import annotations

import time

import torch

from .config import FaultPlan
from .draft_worker import AGREE_ROWS, DraftWorker, _BranchSet
from .events import STAGE_DRAFT_BRANCHES, STAGE_DRAFT_ROLLOUT, STAGE_PREFILL
from .messages import BranchRequest, DraftStart, ResolveRequest, branch_rows
from .runners.protocol import Runner
from .sampling import draft_sample


class FeatureDraftWorker(DraftWorker):
    """The draft lane's work for a feature-reading draft.

    Its cache entry i is (x_{i+1}, f_i): it holds one entry fewer than the committed tokens, and an entry is exact
    only once the target has computed f_i. So the prefill waits for the prompt's features (they come with
    ResolveRequest step 0), and every ResolveRequest carries the features of w0, d1..d_{A_t}: the draft drops its
    guessed entries back to `known` (entries from true features) and feeds (d1, f_w0) .. (c, f_{d_A}) before it
    rolls out g ≤ γ tokens on its own predicted features. M_t carries all the window's slots' features: the branch
    batch first feeds (d1, f_w0) .. (d_L, f_{d_{L−1}}) once (the rows' shared prefix), then each row (j, v) starts at
    (v, f_{slot j}), so an adopted branch's entries up to c are exact and a fallback reuses the first A_t. After
    windows the model did not roll out (a context copy, a window of zero) the committed tokens' features wait in
    `pending` and are fed in one forward with the next rollout or branch batch.
    """

    def _start(self, req: DraftStart) -> None:
        self.req = req
        self.gen = torch.Generator().manual_seed(req.sampling.seed + 1)
        self.cache = self.runner.new_cache()
        self.tokens: list[int] = list(req.prompt_ids)   # committed tokens (the window's drafts are not)
        self.known = 0                                  # cache entries built from the target's own features
        self.prefix = 0                                 # entries past `known` fed with true features (M_t's)
        self.pending: list[torch.Tensor] = []           # [n_i, H] true features of entries known.. not fed yet
        self._start_window(req)                         # (entries of tokens committed while the model did not draft)

    def _with_pending(self, features: torch.Tensor) -> torch.Tensor:
        """features [n, H] for the entries after the pending ones → [pending + n, H] from entry `known` on."""
        return torch.cat([*self.pending, features]) if self.pending else features

    def _branch(self, cmd: BranchRequest) -> None:
        with self._span(STAGE_DRAFT_BRANCHES):
            size = len(self.window)
            self.runner.truncate(self.cache, self.known)
            feed = self.tokens[self.known + 1:] + self.window                 # pending entries, then d1..d_L
            if feed:  # (d_{j+1}, f_j), j < L
                logits, _ = self.runner.forward(self.cache, feed, self._with_pending(cmd.features[:size]))  # [T, V_d+1]
                self._agree(logits, feed[1:len(self.tokens) - self.known - 1], self.known + 2)
                self._count(0, 1)
            self.known, self.pending, self.prefix = len(self.tokens) - 1, [], size
            rows = branch_rows(cmd.topk_ids)
            self.branch_set = self._branch_rows(rows, cmd.features) if rows else None

    def _branch_rows(self, rows: list[tuple[int, int]], features: torch.Tensor) -> _BranchSet:
        """Every row (j, v) rolled out γ tokens from (v, f_{slot j}), as one batch."""
        bcache = self.runner.fork(self.cache, [self.known + j for j, _ in rows])
        ids = torch.tensor([v for _, v in rows], dtype=torch.long)                       # [R]
        feats = features[torch.tensor([j for j, _ in rows])]                              # [R, H]
        tokens, ps = [], []
        for _ in range(self.req.gamma):
            logits, feats = self.runner.forward_rows(bcache, ids, feats)                 # [R, V_d+1], [R, H]
            ids, p = self._sample(logits)
            ids = ids.cpu()
            tokens.append(ids)
            ps.append(p)
            self._count(len(rows), len(rows))
        return _BranchSet(rows, torch.stack(tokens, 1), None if ps[0] is None else torch.stack(ps, 1), bcache)

    def _fed(self, cmd: ResolveRequest) -> int:
        """Rows a fresh rollout would feed now: the pending entries and those of d1..d_{A_t}, c not fed yet, less the
        prompt's (its prefill is the first draft's whenever that comes: no window's cost)."""
        unfed_prompt = max(0, len(self.req.prompt_ids) - 1 - self.known)
        return len(self.tokens) + cmd.accepted - self.known - min(self.prefix, cmd.accepted) - unfed_prompt

    def _miss(self, cmd: ResolveRequest, size: int) -> None:
        """Feed the entries the new features complete in one forward, then draft `size` tokens on predicted features
        (at step 0: the prompt's entries, the draft's prefill)."""
        with self._span(STAGE_PREFILL if self.known == 0 else STAGE_DRAFT_ROLLOUT):
            features = self._with_pending(cmd.features)          # entries known.. (pending, then w0, d1..d_{A_t})
            keep = self.known + min(self.prefix, cmd.accepted)  # entries (d_{j+1}, f_j) already fed for accepted d's
            self.runner.truncate(self.cache, keep)
            feed = (self.tokens + list(self.window[: cmd.accepted]) + [cmd.token])[keep + 1:]  # x_{i+1}, entries keep..
            rows = min(len(feed), AGREE_ROWS + 1)                # the head on the last rows: agreement samples, d1
            t0 = time.perf_counter()
            logits, g = self.runner.forward(self.cache, feed, features[keep - self.known:], rows)  # [rows, V_d+1], [rows, H]
            t1 = time.perf_counter()
            first = len(feed) - rows + 1                         # the feed index the first of those rows predicts
            self._agree(logits[:-1], feed[first:], keep + 1 + first)
            steps = self._roll_out(logits[-1:], g[-1:], size)
            self.chooser.costs.learn_rollout(len(feed), t1 - t0, steps, time.perf_counter() - t1)

    def _keep_committed(self, cmd: ResolveRequest) -> None:
        """Nothing to cut: entries past `known` are brought up to date lazily (`pending`, then `_advance`)."""

    def _advance(self, new: list[int], cmd: ResolveRequest, drafted: bool) -> None:
        """A drafted window (rollout or branch) leaves every committed entry fed; a window the model did not roll out
        leaves the entries of d1..d_{A_t}, c pending (those M_t's features already fed stay: `prefix`)."""
        self.tokens += new
        if drafted:
            self.known, self.pending, self.prefix = len(self.tokens) - 1, [], 0
            return
        if self.prefix:  # M_t's batch fed the window's entries (nothing was pending then): those accepted stay fed
            fed = min(self.prefix, len(cmd.features) - 1)
            self.known, self.pending = self.known + fed, [cmd.features[fed:]]
        else:            # the entries of w0 (and d1..d_{A_t}) wait with the earlier ones, gathered in one tensor when fed
            self.pending.append(cmd.features)
        self.prefix = 0

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens from logits over the draft's vocabulary [R, V_d+1]: target ids [R] and p_draft over the
        target's vocabulary [R, V] (None at T = 0), as draft_sample over the target's would give them."""
        ids, p = draft_sample(logits, self.req.sampling, self.gen)
        return self.runner.target_ids(ids), None if p is None else self.runner.over_target_vocab(p)

    def _agree(self, logits: torch.Tensor, actual: list[int], first: int) -> None:
        """DraftWorker._agree on logits over the target's vocabulary (the draft's [T, V_d+1] gathered: an id outside
        the draft's vocabulary reads "other"'s −inf)."""
        super()._agree(self.runner.over_target_vocab(logits), actual, first)

    def _roll_out(self, logits: torch.Tensor, g: torch.Tensor, size: int) -> int:
        """`size` draft tokens from the last fed entry's output (logits [1, V_d+1], g [1, H]), each next on its predicted
        feature; returns the forwards after the first."""
        window, ps = [], []
        while True:
            ids, p = self._sample(logits)
            window.append(int(ids[0]))
            ps += [] if p is None else list(p)
            self._count(1, 1)                                 # one pass, one token
            if len(window) == size:
                break
            logits, g = self.runner.forward(self.cache, window[-1:], g)
        self.window = window
        self.p_window = torch.stack(ps) if ps else None                                  # [size, V]
        return size - 1


def worker_for(runner: Runner, fault: FaultPlan = FaultPlan()) -> DraftWorker:
    """The draft lane's worker for this runner: a feature-reading draft's own, else the token-only one."""
    return (FeatureDraftWorker if runner.reads_features else DraftWorker)(runner, fault)
