"""Run traces as JSON: every event with its type name, for export and replay."""
from __future__ import annotations

import json
from dataclasses import asdict

from .events import Event


def event_to_dict(event: Event) -> dict:
    return {"type": type(event).__name__, **asdict(event)}


def write_trace(path: str, events: list[Event]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"format": "mirror-sd-trace/1", "events": [event_to_dict(e) for e in events]}, f)
