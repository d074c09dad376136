"""The two lanes: where the draft runs (inline, thread, process), the shared-memory channel and its wire
format, lane placement on devices and cores, and the fault hook. Lanes move messages; they make no
decoding decisions (the draft lane's work is draft_worker.DraftWorker)."""
from .codec import LaneError
from .draft_lanes import DraftLaneSpec, InlineLane, ProcessLane, ThreadLane, make_draft_lane
from .placement import auto_lanes, pinned, prefill_cpus

__all__ = ["LaneError", "DraftLaneSpec", "InlineLane", "ProcessLane", "ThreadLane", "make_draft_lane", "auto_lanes",
           "pinned", "prefill_cpus"]
