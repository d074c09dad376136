"""The draft-lane fault hook (tests and scripts): MIRROR_FAULT_DRAFT_AT_STEP=3 makes the draft lane fail at step 3."""
from __future__ import annotations

import os

FAULT_ENV = "MIRROR_FAULT_DRAFT_AT_STEP"        # e.g. 3: the draft lane fails at step 3
FAULT_MODE_ENV = "MIRROR_FAULT_DRAFT_MODE"      # "raise" (default) or "exit" (the process dies)


def fault_plan_from_env() -> tuple[int | None, str]:
    step = os.environ.get(FAULT_ENV, "").strip()
    return (int(step) if step else None), os.environ.get(FAULT_MODE_ENV, "raise")
