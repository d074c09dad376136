"""The records measured when a pair loads, as small frozen dataclasses (no torch): what every layer above the
runners reads about the load (pair.py's PairInfo, the events' RunSettings, the CLI, the bench, the page).

- RowBand, RowPlan, RowCheck (UNCHECKED): how the target computes each position's logits the same in a one-token
  and a window call on this machine (measured by runners/exactness.py).
- Timing, Calibration: each lane's matmul dtype and the timings behind it (measured by runners/calibrate.py).
- WholeMachine: the target's one-token step timed on its lane's cores and on every core (the whole-machine
  baseline the numbers panel compares against).
- ExitHeadInfo: the trained early-exit head a pair loaded (models/exit_head.py), None where the logit lens reads.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

NEAR_TIES = "outputs may differ from AR at near-ties"
NOT_EXACT = f"not bit-exact on this CPU: {NEAR_TIES}"


# -- the target's call-shape exactness (runners/exactness.py) -------------------------------------------------
@dataclass(frozen=True)
class RowBand:
    """Call sizes an operation's kernel treats alike: every call computes at least lo rows (zero rows after the
    real ones) and at most hi (a longer call is split into chunks of hi); hi None: no upper bound."""

    lo: int = 1
    hi: int | None = None

    def spans(self, m: int) -> list[tuple[int, int, int]]:
        """The chunks of a call of m rows: (first row, end row, rows computed ≥ end − first)."""
        step = m if self.hi is None else self.hi
        return [(a, min(a + step, m), max(min(a + step, m) - a, self.lo)) for a in range(0, m, step)]

    def holds(self, m: int) -> bool:
        """A call of m rows is already inside the band (one plain call)."""
        return self.lo <= m and (self.hi is None or m <= self.hi)

    @property
    def plain(self) -> bool:
        return self.lo == 1 and self.hi is None

    @property
    def label(self) -> str:
        if self.hi is None:
            return "any rows" if self.lo == 1 else f"≥ {self.lo} rows"
        return f"{self.lo} row" if self.lo == self.hi == 1 else f"{self.lo}–{self.hi} rows"


@dataclass(frozen=True)
class RowPlan:
    """The band of every row-shape-dependent operation of one runner (and, being a plan at all, fixed key axes)."""

    bands: tuple[tuple[str, RowBand], ...]

    def band(self, op: str) -> RowBand | None:
        """The op's band, or None where it runs as one plain call."""
        found = next((b for name, b in self.bands if name == op), None)
        return None if found is None or found.plain else found

    @property
    def label(self) -> str:
        """'every matmul in calls of 1–3 rows; …', or each operation's band where they differ."""
        labels = {b.label for _, b in self.bands}
        if len(labels) == 1:
            return f"every matmul in calls of {labels.pop()}; attention over key axes fixed per position"
        groups: dict[str, list[str]] = {}
        for name, band in self.bands:
            if name != "attention":
                groups.setdefault(band.label, []).append(name)
        attention = next((b.label for name, b in self.bands if name == "attention"), "any rows")
        return ("; ".join(f"{', '.join(names)} in calls of {label}" for label, names in groups.items())
                + f"; attention in calls of {attention} (query rows) over key axes fixed per position")

    @classmethod
    def from_dict(cls, d: dict) -> RowPlan:
        return cls(tuple((name, RowBand(**band)) for name, band in d["bands"]))


@dataclass(frozen=True)
class RowCheck:
    """Whether the target computes each position's logits bit for bit the same one token at a time (AR) and inside
    windows of 2..17 rows (SD, Mirror-SD), measured when the pair was loaded, and what made it so."""

    plan: RowPlan | None   # the row bands in use (None: every operation as it is, no fixed key axes)
    invariant: bool        # with that plan, every window's logits equal the one-at-a-time logits, bitwise
    differing: int         # logits (of the V per position) that differed without a plan, summed over window sizes
    checked: bool = True   # False: nothing was measured (a runner that cannot run the probe)
    source: str = ""       # "measured": at this load; "cached": from the calibration cache
    seconds: float = 0.0   # wall time of the search and the checks at this load

    @property
    def describe(self) -> str:
        """One line for every place the run is described (CLI, numbers panel, bench)."""
        if not self.checked:
            return f"not checked for call-shape rounding: {NEAR_TIES}"
        if not self.invariant:
            return NOT_EXACT + (f" (tried: {self.plan.label})" if self.plan else "")
        if self.plan is None:
            return "bit-exact as it is: a position's logits are the same in one-token and window calls here"
        return f"bit-exact by measured call shapes: {self.plan.label}"

    @classmethod
    def from_dict(cls, d: dict) -> RowCheck:
        plan = None if d.get("plan") is None else RowPlan.from_dict(d["plan"])
        return cls(plan, bool(d["invariant"]), int(d["differing"]), bool(d.get("checked", True)),
                   str(d.get("source", "")), float(d.get("seconds", 0.0)))


UNCHECKED = RowCheck(None, False, 0, checked=False)


# -- each lane's dtype (runners/calibrate.py) ---------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    dtype: str
    shape: str   # "step": one token; "window": γ + 1 tokens (target); "rows": a branch rollout of κ(γ + 1) rows,
                 # γ tokens deep (draft)
    ms: float    # median wall time of one forward, after calibrate.PREFIX cached tokens


@dataclass(frozen=True)
class Calibration:
    """Which dtype a lane runs, and the measurements behind the choice."""

    lane: str                    # "target" or "draft"
    requested: str               # "auto" (calibrated) or the dtype forced by --dtype
    sequence: str                # dtype of one-sequence forwards (AR steps, windows; the target: every forward)
    rows: str                    # dtype of branch-row forwards (the draft's rollouts; the target: = sequence)
    table: tuple[Timing, ...] = ()
    note: str = ""               # why this choice, in a few words
    cached: bool = False         # the table came from the cache folder (no forward was timed at this load)
    seconds: float = 0.0         # wall time spent timing at this load
    screened: tuple[str, ...] = ()  # dtypes dropped before timing: their widest matmul was SCREEN times slower
    exact: tuple[tuple[str, RowCheck], ...] = ()  # the target: each timed dtype's call-shape check and row plan
    read_gbs: float = 0.0        # the target: one core's read bandwidth measured on its lane (GB/s; 0: not measured)
    peak_gflops: float = 0.0     # the target: its linear maps' arithmetic rate in the chosen dtype, cache-resident

    def timed(self, names: list[str]) -> list[str]:
        """The names that were timed (the screen dropped the others)."""
        return [n for n in names if n not in self.screened]

    def ms(self, dtype: str, shape: str) -> float | None:
        return next((t.ms for t in self.table if t.dtype == dtype and t.shape == shape), None)

    @property
    def label(self) -> str:
        """'bfloat16', or 'float32 (rows: bfloat16)' when the draft's two shapes differ."""
        return self.sequence if self.rows == self.sequence else f"{self.sequence} (rows: {self.rows})"

    def rows_ms(self, dtype: str) -> tuple[float, ...]:
        """The target's forward of 1, 2, .. ROOFLINE_ROWS new rows in `dtype` (ms), where they were timed."""
        found = [self.ms(dtype, f"rows{m}") for m in range(1, ROOFLINE_ROWS + 1)]
        return () if None in found else tuple(found)

    def window_ms(self, dtype: str, rows: int) -> float | None:
        """The target's forward of `rows` new rows in `dtype` (ms): timed (1..ROOFLINE_ROWS and LONG_ROWS), or linear
        between the nearest timed row counts around it; None where it was not timed."""
        timed = {m: self.ms(dtype, f"rows{m}") for m in (*range(1, ROOFLINE_ROWS + 1), *LONG_ROWS)}
        timed = {m: ms for m, ms in timed.items() if ms is not None}
        if rows in timed:
            return timed[rows]
        below, above = [m for m in timed if m < rows], [m for m in timed if m > rows]
        if not below or not above:
            return None
        lo, hi = max(below), min(above)
        return timed[lo] + (timed[hi] - timed[lo]) * (rows - lo) / (hi - lo)

    def verify_ratio(self) -> float | None:
        """The chosen dtype's window of γ + 1 over its one-token step (the target; ≈ 1 is what SD needs)."""
        step, window = self.ms(self.sequence, "step"), self.ms(self.sequence, "window")
        return window / step if step and window else None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        d["table"] = tuple(Timing(**t) for t in d.get("table", ()))
        d["screened"] = tuple(d.get("screened", ()))
        d["exact"] = tuple((name, RowCheck.from_dict(check)) for name, check in d.get("exact", ()))
        return cls(**d)


# -- what else a load measures or finds ---------------------------------------------------------------------
ROOFLINE_ROWS = 8  # the target's forward is timed at load for 1..8 new rows (the AR step and windows up to γ = 7)
# ... and for these longer windows (a context window of up to MAX_GAMMA = 16 tokens verifies 17 rows), in between
# which the context draft's cost by rows is interpolated (Calibration.window_ms)
LONG_ROWS = (12, 17)


@dataclass(frozen=True)
class Roofline:
    """The target's forward against the memory roofline, measured at load on its lane: the kernel that runs its
    linear maps, the bytes of weights a forward streams, the target lane's read bandwidth, and the forward's time by
    its number of new rows (an AR step is 1 row, a verification γ + 1). The fields are measured; the limits derived
    from them (roofline_ms, compute_ms) are modelled."""

    kernel: str                  # the exact small-row kernel's variant (kernels/native.py), or "torch" (matmul + plan)
    kernel_note: str             # why "torch" where the kernel is not used ("" when it is)
    weight_format: str           # the target's weight format (float32, bfloat16, float16; accumulation float32)
    weight_bytes: int            # bytes of weights one forward streams (linear maps and LM head)
    read_gbs: float              # the target lane's read bandwidth (GB/s): one thread's stream with the kernel
    rows_ms: tuple[float, ...]   # the forward of 1, 2, .. new rows (ms)
    weight_params: int = 0       # multiply-adds per row of the linear maps and LM head (a row costs 2 × this in flops)
    peak_gflops: float = 0.0     # the linear maps' arithmetic rate here with nothing to wait for (GFLOP/s, measured)
    machine_cores: int = 0       # every usable core (the baseline's), when the lane holds fewer (0: not measured)
    machine_read_gbs: float = 0.0  # those cores reading together (GB/s, measured)
    machine_step_ms: float = 0.0   # the one-token step on them (ms, measured: WholeMachine.all_ms)

    @property
    def machine_roofline_ms(self) -> float | None:
        """The least a one-token step on every core can cost: weight bytes ÷ their read bandwidth (ms)."""
        return self.weight_bytes / self.machine_read_gbs / 1e6 if self.machine_read_gbs > 0 else None

    @property
    def machine_step_fraction(self) -> float | None:
        """The whole-machine step's share of its roofline (1 = at the limit)."""
        limit = self.machine_roofline_ms
        return limit / self.machine_step_ms if limit and self.machine_step_ms else None

    def compute_ms(self, rows: int) -> float | None:
        """The least the arithmetic of `rows` rows can cost here: 2 · rows · weight_params ÷ peak (ms)."""
        return 2 * rows * self.weight_params / self.peak_gflops / 1e6 if self.peak_gflops > 0 else None

    @property
    def roofline_ms(self) -> float | None:
        """The least a one-token step can cost here: weight bytes ÷ read bandwidth (ms)."""
        return self.weight_bytes / self.read_gbs / 1e6 if self.read_gbs > 0 else None

    @property
    def step_fraction(self) -> float | None:
        """The AR step's share of the roofline: roofline ÷ measured one-row forward (1 = at the limit)."""
        return self.roofline_ms / self.rows_ms[0] if self.rows_ms and self.roofline_ms else None

    def window_steps(self, rows: int) -> float | None:
        """A forward of `rows` new rows in one-token steps (≈ 1 while the pass is memory-bound)."""
        return self.rows_ms[rows - 1] / self.rows_ms[0] if 1 <= rows <= len(self.rows_ms) else None

    def to_dict(self) -> dict:
        return {**asdict(self), "roofline_ms": _round(self.roofline_ms), "step_fraction": _round(self.step_fraction),
                "machine_roofline_ms": _round(self.machine_roofline_ms),
                "machine_step_fraction": _round(self.machine_step_fraction),
                "compute_ms": [_round(self.compute_ms(m)) for m in range(1, len(self.rows_ms) + 1)],
                "window_steps": [_round(self.window_steps(m)) for m in range(1, len(self.rows_ms) + 1)]}

    @property
    def describe(self) -> str:
        """One line: the kernel, bytes per token, and the step against its roofline."""
        kernel = f"kernel {self.kernel}" if self.kernel != "torch" else f"torch matmul ({self.kernel_note})"
        line = f"{kernel}; {self.weight_format} weights, {self.weight_bytes / 1e6:.0f} MB per token"
        if self.roofline_ms and self.rows_ms:
            line += (f"; step {self.rows_ms[0]:.1f} ms = {self.step_fraction:.0%} of the roofline "
                     f"({self.roofline_ms:.1f} ms at {self.read_gbs:.0f} GB/s)")
        if len(self.rows_ms) >= 5:
            line += f"; 5 rows cost {self.window_steps(5):.2f} steps"
        if self.machine_step_fraction:
            line += (f"; on all {self.machine_cores} cores a step {self.machine_step_ms:.1f} ms = "
                     f"{self.machine_step_fraction:.0%} of the roofline ({self.machine_roofline_ms:.1f} ms at "
                     f"{self.machine_read_gbs:.0f} GB/s)")
        return line


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)



BUSY_SPREAD = 1.5  # WholeMachine.busy: a series of step timings whose slowest is this many times its best
# The whole machine's one-token step against the lane's: more cores are never this many times slower (another process
# held one of them while it was timed), and the lane's half of the cores never this many times slower than all of
# them (the lane's timing was held up); a timing outside these bounds is re-timed and never used as a baseline or a
# correction (WholeMachine.bounded), so no correction beyond this factor is ever printed.
WHOLE_MACHINE_BOUND = 3.0


@dataclass(frozen=True)
class WholeMachine:
    """The target's one-token step timed at load (and again before each of the page's comparisons) on its lane's
    cores and on every core of the machine (the whole-machine baseline: AR with nothing else running), when the target
    lane was given some of the cores."""

    lane_cores: int
    lane_ms: float                    # the best of the alternated timings (the least interference: a cost)
    all_cores: int
    all_ms: float                     # the best of the alternated timings
    ratios: tuple[float, ...] = ()    # all-cores step ÷ lane step, one per alternated pair of timings
    read_gbs: float = 0.0             # every core reading together (GB/s, measured; 0: not measured)
    spread: float = 1.0               # within each series, its slowest timing ÷ its best (the larger of the two)
    retimed: int = 0                  # timings discarded before this one for lying outside the bounds

    @property
    def busy(self) -> bool:
        """Whether another process took the cores while the load timed them: one series' timings spread by more
        than BUSY_SPREAD (a quiet machine's repeat within a few per cent)."""
        return self.spread > BUSY_SPREAD

    @property
    def bounded(self) -> bool:
        """Whether the two steps are within WHOLE_MACHINE_BOUND of each other, either way: what this machine's cores
        can give with nothing else running."""
        return bool(self.lane_ms and self.all_ms) and 1 / WHOLE_MACHINE_BOUND <= self.all_ms / self.lane_ms <= \
            WHOLE_MACHINE_BOUND

    @property
    def settled(self) -> bool:
        """Whether every pair of timings puts the whole machine on the same side of the lane (the factor is not
        timing noise: one machine's loads read 1.05×, 1.45× and 1.23× from a single pair each)."""
        return len(self.ratios) >= 2 and (min(self.ratios) > 1 or max(self.ratios) < 1)


@dataclass(frozen=True)
class ExitHeadInfo:
    """The trained early-exit head a pair loaded (models/exit_head.py): its layer ℓ_e, the target tokens its
    readout ranks, and the folder it came from."""

    layer: int
    readout_tokens: int
    source: str | None
