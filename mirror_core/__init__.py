"""Mirror Speculative Decoding engine: token ids in, typed events out (no text, no UI)."""
from .config import DECODER_NAMES, FaultPlan, LaneConfig, MirrorError, Request, SamplingConfig, SpecConfig
from .decode import DECODERS
from .engine import MirrorEngine
from .events import (Event, RejectedEvent, RunEnd, RunSettings, RunStart, SpanEvent, StepRecord, TokenEvent,
                     event_to_dict, write_trace)
from .lanes.placement import auto_lanes
from .metrics import RunSummary
from .models.textstream import IncrementalText
from .pair import PairInfo

__all__ = ["MirrorEngine", "PairInfo", "auto_lanes", "DECODER_NAMES", "DECODERS", "FaultPlan", "LaneConfig",
           "MirrorError", "Request", "SamplingConfig", "SpecConfig", "Event", "RejectedEvent", "RunEnd", "RunSettings",
           "RunStart", "RunSummary", "SpanEvent", "StepRecord", "TokenEvent", "IncrementalText", "event_to_dict",
           "write_trace"]
