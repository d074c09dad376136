"""The opening and the record of a distillation run, shared by distill.py and feature_distill.py."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch


def prepare_run(threads: int, work: str, seed: int, target: str) -> tuple[str, torch.Generator]:
    """The opening of a distillation: its threads, its work folder, the target's folder and the run's generator."""
    from mirror_core.models.prepared import resolve_source

    if threads:
        torch.set_num_threads(threads)
    os.makedirs(work, exist_ok=True)
    return resolve_source(target), torch.Generator().manual_seed(seed)


def run_record(cfg) -> dict:
    """The opening of a run's summary: its configuration and the machine it ran on."""
    from mirror_core.machine import cpu_flags, cpu_model

    return {"config": asdict(cfg), "cpu": cpu_model(), "cpu_flags": " ".join(sorted(cpu_flags())),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def write_record(path: str, summary: dict) -> dict:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary
