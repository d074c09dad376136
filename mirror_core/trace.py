"""Run traces as JSON: every event with its type name, for export and replay."""
from __future__ import annotations

import json
from dataclasses import asdict

from .events import Event, RunEnd, RunStart


def event_to_dict(event: Event) -> dict:
    if isinstance(event, RunStart):
        return {"type": "RunStart", "decoder": event.decoder, "prompt_ids": list(event.prompt_ids),
                "settings": event.settings.to_dict(), "t0": event.t0}
    if isinstance(event, RunEnd):
        return {"type": "RunEnd", "token_ids": list(event.token_ids), "stats": event.summary.to_dict(),
                "fallback": event.fallback, "stopped": event.stopped, "error": event.error}
    return {"type": type(event).__name__, **asdict(event)}


def write_trace(path: str, events: list[Event], text: dict | None = None) -> None:
    """The events as JSON; `text` (front-ends with a tokenizer: the prompt and each decoder's output) rides along."""
    trace = {"format": "mirror-sd-trace/1", **({"text": text} if text else {}),
             "events": [event_to_dict(e) for e in events]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
