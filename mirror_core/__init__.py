"""Mirror Speculative Decoding engine: token ids in, typed events out (no text, no UI)."""
from .engine import MirrorEngine, PairInfo
from .lanes.placement import auto_lanes
from .config import DECODER_NAMES, LaneConfig, MirrorError, Request, SamplingConfig, SpecConfig
from .decode import DECODERS
from .events import (Event, RejectedEvent, RunEnd, RunStart, SpanEvent, StepRecord, TokenEvent)
from .textstream import IncrementalText
from .trace import event_to_dict, write_trace

__all__ = ["MirrorEngine", "PairInfo", "auto_lanes", "DECODER_NAMES", "DECODERS", "LaneConfig", "MirrorError",
           "Request", "SamplingConfig", "SpecConfig", "Event", "RejectedEvent", "RunEnd", "RunStart", "SpanEvent",
           "StepRecord", "TokenEvent", "IncrementalText", "event_to_dict", "write_trace"]
