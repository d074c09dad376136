"""The branch tree of one Mirror-SD step: each slot's early-exit candidates as roots, each candidate's rollout as
its chain, in one frame with what verification decided (StepRecord → HTML, no engine calls).

Slots are numbered 1..γ+1 as in every view (docs/ALGORITHM.md §1): slot j holds the target's check of draft token
d_j, slot γ+1 the bonus. The correction lands at slot s_t = A_t + 1, so only that slot is decided by this step: its
candidates hold the correction on a hit. Later slots are unreachable (dimmed): the target rejected an earlier token.
Candidates the planner left out (the branch budget) are greyed as pruned.
"""
from __future__ import annotations

import html
import math

from mirror_core import StepRecord

from ..render import drafts
from ..session import DecoderRun, pick_step


def first_steps(run: DecoderRun | None) -> tuple[int | None, int | None]:
    """(first hit step, first miss step) of a Mirror-SD run: the tree's and the step player's default picks."""
    if run is None:
        return None, None
    hit = next((r.step for r in run.steps if r.hit), None)
    miss = next((r.step for r in run.steps if r.hit is False), None)
    return hit, miss


def tree_html(run: DecoderRun | None, step: float | None) -> str:
    if run is None or run.decoder != "mirror" or not run.steps:
        return "<p><i>Run Mirror-SD on the Run tab, then pick a step: its branch tree appears here.</i></p>"
    rec = pick_step(run, step, first_steps(run)[0] or run.steps[0].step)
    if isinstance(rec, str):
        return rec
    name = run.namer.show
    return _caption(rec, name) + "<div class='mirror-tree'>" + "".join(
        _slot(rec, s, name) for s in range(len(rec.topk_ids))) + "</div>"


def _caption(rec: StepRecord, name) -> str:
    window = " ".join(f"<code>{html.escape(name(t))}</code>" for t in rec.window[1:]) or "—"
    c = f"<code>{html.escape(name(rec.token))}</code>"
    slot = rec.accepted + 1  # s_t: the 1-based slot of the correction or bonus
    if rec.hit is None:
        verdict = "no branches reached the draft lane this step"
    elif rec.hit:
        verdict = f"<b class='mirror-fast'>hit</b>: c = {c} was a candidate at slot {slot}, its branch is the next window"
    else:
        verdict = f"<b class='mirror-slow'>miss</b>: c = {c} was not a candidate at slot {slot}; the draft rolled out afresh"
    return (f"<p><b>Step {rec.step}</b>: window {drafts(rec.drafted)} = {window}; the target accepted A_t = "
            f"{rec.accepted}, so slot s_t = A_t + 1 = {slot} decides: {verdict}.</p>"
            "<p class='mirror-def'>Each row is a slot j (1..γ+1): the target's check of d_j, where the correction goes "
            "if the target accepts exactly j − 1 draft tokens (slot γ+1: the bonus). Its roots are the early-exit "
            "top-κ there (p_exit), each followed by the γ tokens the draft "
            "rolled out for it during the target's last layers. Greyed: pruned by the branch budget (no rollout). "
            "Dimmed rows: unreachable, the target rejected an earlier token.</p>")


def _slot(rec: StepRecord, s: int, name) -> str:
    """Slot s + 1 (s: the engine's 0-based index into the window's slots)."""
    rows = {cand: r for r, (slot, cand) in enumerate(rec.branch_rows) if slot == s}
    rows_any = bool(rec.branch_rows)  # no rows at all: nothing was rolled out this step (not a budget's choice)
    reachable = s <= rec.accepted
    label = "after w0" if s == 0 else f"after {drafts(s)}"
    roots = []
    for token, logp in zip(rec.topk_ids[s], rec.topk_logprobs[s] if s < len(rec.topk_logprobs) else ()):
        if token < 0:
            continue
        p = f"{math.exp(logp):.3f}"
        r = rows.get(token)
        chosen = s == rec.accepted and token == rec.token
        cls = ("mirror-node" + (" mirror-node-hit" if chosen else "")
               + ("" if r is not None or not rows_any else " mirror-node-pruned"))
        chain = ""
        if r is not None and r < len(rec.branches):
            reused = r == rec.branch_row
            chain = "".join(f"<span class='mirror-edge'>→</span><span class='mirror-node"
                            f"{' mirror-node-reused' if reused else ''}'><code>{html.escape(name(t))}</code></span>"
                            for t in rec.branches[r])
        note = "" if r is not None or not rows_any else " <i>pruned (budget)</i>"
        roots.append(f"<div class='mirror-branch'><span class='{cls}' title='p_exit {p}'><code>"
                     f"{html.escape(name(token))}</code> {p}{note}</span>{chain}</div>")
    body = "".join(roots) or "<i>no candidates</i>"
    return (f"<div class='mirror-tree-slot{'' if reachable else ' mirror-tree-dim'}'><div class='mirror-tree-label'>"
            f"slot {s + 1} <span class='mirror-def'>{label}</span></div><div>{body}</div></div>")
