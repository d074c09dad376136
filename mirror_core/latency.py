"""The latency model (docs/ALGORITHM.md §4) and the timing bounds of one run, from its SpanEvents and StepRecords.

Pure functions: spans and step records in, seconds and ratios out. The UI's latency table and the
bench harness both use them, so "modelled" means the same thing everywhere.

- Latency model (means over verification steps ≥ 1, because it predicts an expected step time):
  T_Mirror = T_pre + T_rv^ee + max(Δ, T_draft^gen(γ)) + T_rv^fv;  E[T_step] = T_Mirror + FF · T_fresh;
  speedup vs AR ≈ τ · T_AR / E[T_step].  Vanilla SD: T_SD = T_pre + Δ + T_fresh (serial).
- Physical bound of any speculative decoder with a fully hidden draft: τ · T_AR / T_verify, with
  T_AR the median target-only step and T_verify the median verification pass (medians: robust to
  the VM's drift).
- Hidden-draft bound of one Mirror-SD step: the verification pass + acceptance + the fastest reply
  of the draft lane seen in the run (the message round trip plus adopting a branch); a measured
  step time near it means the draft is hidden.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import fmean, median

from .events import (
    LANE_TARGET,
    STAGE_ACCEPT,
    STAGE_DRAFT_BRANCHES,
    STAGE_DRAFT_ROLLOUT,
    STAGE_EXIT_READOUT,
    STAGE_SELECT_BRANCH,
    STAGE_TARGET_PREFIX,
    STAGE_TARGET_STEP,
    STAGE_TARGET_SUFFIX,
    STAGE_TARGET_VERIFY,
    STAGE_WAIT,
    SpanEvent,
    StepRecord,
)
from .config import DEFAULT_GAMMA, DEFAULT_KAPPA
from .metrics import RunSummary

VERIFY_STAGES = (STAGE_TARGET_VERIFY, STAGE_TARGET_PREFIX, STAGE_EXIT_READOUT, STAGE_TARGET_SUFFIX)


@dataclass(frozen=True)
class LatencyModel:
    """docs/ALGORITHM.md §4 terms (seconds, means over steps ≥ 1 of the Mirror-SD run) and its predictions."""

    t_pre: float          # target layers 1..ℓ_e (target_prefix spans)
    t_rv_ee: float        # early-exit readout + sending top-κ (exit_readout spans)
    delta: float          # Δ: target layers ℓ_e+1..N (target_suffix spans)
    t_branch: float       # T_draft^gen(γ) for the branch batch (draft_branches spans)
    t_rv_fv: float        # final readout: acceptance + adopting a branch (accept + select_branch spans)
    t_fresh: float        # a fresh γ-token rollout (draft_rollout spans)
    ff: float             # fallback frequency
    tau: float
    t_ar: float | None    # one target-only step (target_step spans of an AR run)
    measured_step: float  # measured mean step time of the Mirror-SD run

    @property
    def t_mirror(self) -> float:
        return self.t_pre + self.t_rv_ee + max(self.delta, self.t_branch) + self.t_rv_fv

    @property
    def expected_step(self) -> float:
        return self.t_mirror + self.ff * self.t_fresh

    @property
    def speedup(self) -> float | None:
        return None if not self.t_ar else self.tau * self.t_ar / self.expected_step

    @property
    def t_sd(self) -> float:
        """Vanilla SD's step (App. C): the whole verification pass, then a serial fresh rollout."""
        return self.t_pre + self.delta + self.t_fresh

    @property
    def sd_speedup(self) -> float | None:
        return None if not self.t_ar else self.tau * self.t_ar / self.t_sd


def per_step_totals(spans: list[SpanEvent], stages: tuple[str, ...], first_step: int = 1) -> dict[int, float]:
    """Time spent in `stages` per step (several spans of one step add up)."""
    out: dict[int, float] = {}
    for s in spans:
        if s.stage in stages and s.step >= first_step:
            out[s.step] = out.get(s.step, 0.0) + (s.t1 - s.t0)
    return out


def stage_mean(spans: list[SpanEvent], stages: tuple[str, ...], first_step: int = 1) -> float:
    """Mean time per step spent in `stages` (0 when never seen)."""
    totals = per_step_totals(spans, stages, first_step)
    return fmean(totals.values()) if totals else 0.0


def stage_median(spans: list[SpanEvent], stages: tuple[str, ...], first_step: int = 1) -> float | None:
    totals = per_step_totals(spans, stages, first_step)
    return median(totals.values()) if totals else None


def step_times(spans: list[SpanEvent], steps: list[StepRecord]) -> list[float]:
    """Per verification step: its first target span's start → its StepRecord (next window in hand)."""
    starts: dict[int, float] = {}
    for s in spans:
        if s.lane == LANE_TARGET and s.step >= 1:
            starts[s.step] = min(starts.get(s.step, s.t0), s.t0)
    return [r.t_end - starts[r.step] for r in steps if r.step in starts]


def ar_step_time(spans: list[SpanEvent]) -> float | None:
    """T_AR: the median target-only decode step of an ar run."""
    return stage_median(spans, (STAGE_TARGET_STEP,))


def verify_time(spans: list[SpanEvent]) -> float | None:
    """T_verify: the median verification pass (sd: one span; mirror: prefix + readout + suffix)."""
    return stage_median(spans, VERIFY_STAGES)


def physical_bound(tau: float | None, t_ar: float | None, t_verify: float | None) -> float | None:
    """τ · T_AR / T_verify: the speedup over AR with the draft entirely free."""
    return tau * t_ar / t_verify if tau and t_ar and t_verify else None


def hidden_draft_bound(spans: list[SpanEvent]) -> float | None:
    """A Mirror-SD step with the draft hidden: median(verification + acceptance) + the fastest draft reply."""
    verify = per_step_totals(spans, VERIFY_STAGES + (STAGE_ACCEPT,))
    waits = per_step_totals(spans, (STAGE_WAIT,))
    if not verify or not waits:
        return None
    return median(verify.values()) + min(waits.values())


def latency_model_from_events(spans: list[SpanEvent], steps: list[StepRecord], summary: RunSummary,
                              t_ar: float | None) -> LatencyModel | None:
    """The §4 model from one Mirror-SD run's spans (None without verification steps)."""
    times = step_times(spans, steps)
    if not times:
        return None
    return LatencyModel(
        t_pre=stage_mean(spans, (STAGE_TARGET_PREFIX,)), t_rv_ee=stage_mean(spans, (STAGE_EXIT_READOUT,)),
        delta=stage_mean(spans, (STAGE_TARGET_SUFFIX,)), t_branch=stage_mean(spans, (STAGE_DRAFT_BRANCHES,)),
        t_rv_fv=stage_mean(spans, (STAGE_ACCEPT,)) + stage_mean(spans, (STAGE_SELECT_BRANCH,)),
        t_fresh=stage_mean(spans, (STAGE_DRAFT_ROLLOUT,), first_step=0), ff=summary.fallback_frequency or 0.0,
        tau=summary.tau or 1.0, t_ar=t_ar, measured_step=fmean(times))


# -- settings chosen per machine (modelled) ------------------------------------------------------------------------
@dataclass(frozen=True)
class StepOverheads:
    """What a speculative step costs beyond the target's passes and the draft's rollouts (ms), timed at load by a short
    run of each decoder (MirrorEngine.load: phases.step_phases of its steps, every step a draft-model window)."""
    readout: float   # Mirror-SD's early-exit readout T_rv^ee: top-κ per slot at ℓ_e, M_t sent to the draft lane
    sd: float        # vanilla SD's acceptance, the loop's bookkeeping, and the wait beyond the draft's rollouts
    mirror: float    # the same for Mirror-SD (its wait beyond the branches and rollouts the model already holds)
    sd_verify: float = 0.0  # vanilla SD's verification of a γ-token window where it ran (ar's cores), measured ...
    gamma: int = 0          # ... at this γ (0: not measured): its ratio to the lane's T_verify(γ) scales every γ's
    mirror_verify: float = 0.0  # Mirror-SD's window (T_pre + Δ) at that γ, beside the draft's rollouts: the same
    ar_step: float = 0.0    # ar's one-token step where ar runs, timed in the same short runs (0: not): the baseline
    rollout: float = 0.0    # vanilla SD's rollout of a γ-token window as it ran (its catch-up rows included; 0: not)


@dataclass(frozen=True)
class StepCosts:
    """This machine's step costs for one pair, in ms, as the lanes' dtype calibrations timed them at load
    (runners/calibrate.py: cached per machine and model shape)."""
    t_ar: float             # target: one-token step
    t_window: float         # target: a window of `window_rows` tokens
    window_rows: int
    exit_share: float       # ℓ_e / N: the share of a verification pass before the early exit (layers as equal)
    draft_step: float       # draft: one-token step
    draft_rows: float       # draft: a branch rollout of `rows` rows, `depth` tokens deep
    rows: int
    depth: int
    baseline: float | None = None  # the baseline's one-token step (AR on every core, as ar and sd run; None: t_ar)
    overheads: StepOverheads | None = None  # what a step costs beyond the passes and rollouts (None: not timed)

    @property
    def base(self) -> float:
        """T_base: the one-token step every modelled speedup is a ratio against."""
        return self.baseline if self.baseline else self.t_ar

    def verify(self, gamma: int) -> float:
        """T_verify(γ): the window's cost, linear in its rows between the two timed shapes."""
        return self.t_ar + (self.t_window - self.t_ar) * gamma / (self.window_rows - 1)

    @property
    def draft_token(self) -> float:
        """The draft's cost a drafted token: as SD's rollouts ran at load (their catch-up rows included), else its
        timed one-token step."""
        o = self.overheads
        return o.rollout / o.gamma if o and o.rollout and o.gamma else self.draft_step

    def mirror_window(self, gamma: int) -> float:
        """Mirror-SD's window: T_verify(γ) scaled by what the load measured of it beside the draft's rollouts."""
        o = self.overheads
        return self.verify(gamma) * (o.mirror_verify / self.verify(o.gamma) if o and o.mirror_verify and o.gamma else 1.0)

    def sd_window(self, gamma: int) -> float:
        """Vanilla SD's window on the baseline's cores: T_verify(γ) scaled by what the load measured of it there, else
        by T_base / T_AR."""
        o = self.overheads
        return self.verify(gamma) * (o.sd_verify / self.verify(o.gamma) if o and o.sd_verify and o.gamma
                                     else self.base / self.t_ar)

    def branch(self, rows: int, gamma: int) -> float:
        """T_branch: a branch batch costs its rows × depth in row-tokens (measured: a CPU's batch costs nearly
        rows × one row), plus one pass over the window for a feature-reading draft's shared prefix."""
        return self.draft_rows * rows * gamma / (self.rows * self.depth) + self.draft_step


def step_costs(info, exit_layer: int | None = None) -> StepCosts | None:
    """The costs the load's latency model chooses γ, κ with (ms), from a loaded pair's pair.PairInfo: the lanes' calibrations (a window at the default γ,
    a branch batch at the default κ, γ), ℓ_e/N at `exit_layer` (the pair's own where None), and the baseline: ar's
    step as the load's short runs timed it beside the speculative decoders' (the same minute's machine), else the
    whole machine's where ar runs on every core, else the lane's (None). None where a lane's dtype was forced without
    timing."""
    target, draft = info.target_dtype, info.draft_dtype
    if target is None or draft is None:
        return None
    shapes = (target.ms(target.sequence, "step"), target.ms(target.sequence, "window"),
              draft.ms(draft.sequence, "step"), draft.ms(draft.rows, "rows"))
    if any(v is None for v in shapes):
        return None
    whole, o = info.whole_machine, info.overheads
    baseline = o.ar_step if o is not None and o.ar_step else whole.all_ms if whole is not None and info.serial_cpus \
        else None
    layer = exit_layer if exit_layer is not None else info.default_exit_layer()
    t_ar, t_window, d_step, d_rows = shapes
    window = DEFAULT_GAMMA + 1  # the shapes runners/calibrate.py times: a window at the default γ, a branch batch
    return StepCosts(t_ar, t_window, window, layer / info.num_layers, d_step, d_rows, DEFAULT_KAPPA * window,
                     DEFAULT_GAMMA, baseline, o)


GAMMAS, KAPPAS = range(1, 9), range(1, 5)  # the settings choose_spec tries (a draft's profile measures τ at each γ)


@dataclass(frozen=True)
class DraftProfile:
    """How often a pair's draft and early exit are right, measured on held-out answers when it was trained (the draft
    folder's draft_profile.json)."""
    accept: tuple[float, ...]   # a_d: the d-th draft token agrees with the target given d−1 that did, d = 1, 2, ..
    hit: tuple[float, ...]      # the target's token is among the exit's top-κ (the draft's own token excluded)
                                # where the draft was wrong, κ = 1, 2, ..
    tau_by_gamma: tuple[float, ...] = ()  # τ(γ), γ = 1, 2, ..: greedy decoding's own rollouts replayed on the
                                          # held-out answers (training/draft/replay.py, chains); () = not measured
    hit_by_gamma: tuple[tuple[float, ...], ...] = ()  # [γ − 1][κ − 1]: the share of those rollouts whose correction
                                          # or bonus token was among the exit's top-κ at its slot; () = not measured

    def tau(self, gamma: int) -> float:
        """τ(γ): the measured one where the profile has it; else 1 + E[A_t] = 1 + Σ_k Π_{d≤k} a_d (a_d past the
        measured depths: the last one), continued from the last measured τ."""
        n = min(gamma, len(self.tau_by_gamma))
        if n == gamma and n:
            return self.tau_by_gamma[n - 1]
        return self._product_tau(gamma) + (self.tau_by_gamma[n - 1] - self._product_tau(n) if n else 0.0)

    def with_accept(self, accept: tuple[float, ...]) -> DraftProfile:
        """This profile with other a_d (a draft that agrees more, modelled): a measured τ(γ) moves by what the product
        form says the change is worth; the hit rates stay."""
        moved = replace(self, accept=accept, tau_by_gamma=())
        return replace(moved, tau_by_gamma=tuple(t + moved.tau(g) - self._product_tau(g)
                                                 for g, t in enumerate(self.tau_by_gamma, 1)))

    def _product_tau(self, gamma: int) -> float:
        reach, total = 1.0, 1.0
        for d in range(gamma):
            reach *= self.accept[min(d, len(self.accept) - 1)]
            total += reach
        return total

    def hit_rate(self, kappa: int, gamma: int | None = None) -> float:
        """Mirror-SD's hit rate at κ (and γ): the replayed one where the profile has it, else `hit`."""
        if gamma is not None and self.hit_by_gamma:  # past the measured γ: the last one measured
            row = self.hit_by_gamma[min(gamma, len(self.hit_by_gamma)) - 1]
            return row[min(kappa, len(row)) - 1]
        return self.hit[min(kappa, len(self.hit)) - 1]


@dataclass(frozen=True)
class SpecChoice:
    """The γ and κ the latency model (§4, with the costs and profile above) predicts fastest here, and why."""
    gamma: int
    kappa: int
    speedup: float                          # modelled Mirror-SD speedup over ar at that setting
    sd_speedup: float                       # modelled vanilla SD speedup at that γ
    why: str                                # one line, for the page and --json
    table: tuple[tuple[int, int, float], ...]  # (γ, κ, modelled speedup) for every setting tried


def modelled_speedups(costs: StepCosts, profile: DraftProfile, gamma: int, kappa: int) -> tuple[float, float]:
    """(Mirror-SD, vanilla SD) speedups over the baseline: τ · T_base / E[T_step], E[T_step] from §4 with every
    branch row of κ(γ+1) rolled out, FF = 1 − hit rate, and T_fresh = γ draft steps, plus each decoder's overheads
    timed at load (the readout T_rv^ee; acceptance, bookkeeping and messages). Each decoder's window is the lane's
    T_verify(γ) scaled by what the load's short run measured of it where it runs (Mirror-SD's on its lane beside the
    draft's rollouts; SD's on the baseline's cores); without those runs Mirror-SD's as timed, SD's by T_base / T_AR
    (on every core a window gains less than one row does)."""
    o = costs.overheads or StepOverheads(0.0, 0.0, 0.0)
    tau, window, fresh = profile.tau(gamma), costs.mirror_window(gamma), gamma * costs.draft_token
    pre, delta = costs.exit_share * window, (1 - costs.exit_share) * window
    branch = costs.branch(kappa * (gamma + 1), gamma)
    mirror = pre + o.readout + max(delta, branch) + (1 - profile.hit_rate(kappa, gamma)) * fresh + o.mirror
    return tau * costs.base / mirror, tau * costs.base / (costs.sd_window(gamma) + fresh + o.sd)


def choose_spec(costs: StepCosts, profile: DraftProfile, gammas=GAMMAS, kappas=KAPPAS) -> SpecChoice:
    """The fastest (γ, κ) by the model; `why` says what one more draft token would cost and earn here."""
    table = tuple((g, k, round(modelled_speedups(costs, profile, g, k)[0], 3)) for g in gammas for k in kappas)
    gamma, kappa, best = max(table, key=lambda r: (r[2], -r[0], -r[1]))
    sd = modelled_speedups(costs, profile, gamma, kappa)[1]
    more = [s for g, k, s in table if g == gamma + 1 and k == kappa]
    if more:
        t0, t1 = profile.tau(gamma), profile.tau(gamma + 1)
        extra = costs.verify(gamma + 1) - costs.verify(gamma) + costs.draft_step
        why = (f"γ {gamma}: a {_nth(gamma + 1)} draft token adds {t1 - t0:.2f} expected tokens per step but costs "
               f"{extra:.1f} ms more here (modelled {more[0]:.2f}x vs {best:.2f}x {_base(costs)}); κ {kappa}: "
               f"hit rate {profile.hit_rate(kappa, gamma):.2f}, {kappa * (gamma + 1)} branch rows")
    else:
        why = f"γ {gamma}, κ {kappa}: the largest tried (modelled {best:.2f}x {_base(costs)})"
    return SpecChoice(gamma, kappa, best, round(sd, 3), why, table)


def _base(costs: StepCosts) -> str:
    return "AR on every core" if costs.baseline else "ar"


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
