"""The draft-lane fault hook for tests and scripts, read from the environment once, where an engine is loaded.

    MIRROR_FAULT_DRAFT_AT_STEP=3 MIRROR_FAULT_DRAFT_MODE=exit python -m mirror_core generate ...

makes the draft lane fail when step 3's command arrives (mode "raise": an exception in the worker;
"exit": the lane's process dies). The run must then finish on the target alone with the same output.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..config import FaultPlan, MirrorError

FAULT_ENV = "MIRROR_FAULT_DRAFT_AT_STEP"        # e.g. 3: the draft lane fails at step 3
FAULT_MODE_ENV = "MIRROR_FAULT_DRAFT_MODE"      # "raise" (default) or "exit" (the process dies)


def fault_plan_from_env(env: Mapping[str, str]) -> FaultPlan:
    step = env.get(FAULT_ENV, "").strip()
    if step and not step.isdigit():
        raise MirrorError(f"{FAULT_ENV} must be a step number, got {step!r}")
    return FaultPlan(int(step) if step else None, env.get(FAULT_MODE_ENV, "raise"))
