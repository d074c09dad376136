"""Step inspector: one StepRecord → HTML (window, per-slot early-exit top-κ, branches, hit or why it fell back)."""
from __future__ import annotations

import html
import math

from mirror_core import StepRecord

from .session import DecoderRun

MAX_BRANCH_ROWS = 64


def inspector_html(run: DecoderRun | None, step: float | None) -> str:
    if run is None or not run.steps:
        return "<p><i>Run SD or Mirror-SD, then pick a step to inspect.</i></p>"
    try:
        step = int(float(step or 1))
    except (TypeError, ValueError, OverflowError):
        return f"<p><i>The step must be a whole number (steps 1..{run.steps[-1].step}).</i></p>"
    rec = next((r for r in run.steps if r.step == step), None)
    if rec is None:
        return f"<p><i>Step {step} is not in this run (steps 1..{run.steps[-1].step}).</i></p>"
    name = run.namer.show
    bonus = rec.accepted == rec.drafted
    kind = "bonus" if bonus else "correction"
    head = (f"<p><b>Step {rec.step}</b>: the target verified W = [w0, d1..d{rec.drafted}] in one pass, accepted "
            f"A_t = {rec.accepted}, and its {kind} c = <code>{html.escape(name(rec.token))}</code> sits at slot "
            f"τ = {rec.accepted + 1}; {rec.committed} token(s) committed. This window was "
            + ("<b>a reused branch</b> (a hit at the previous step)." if rec.from_branch else "a fresh draft rollout.")
            + "</p>")
    return head + _slots_table(rec, name) + _branches(run.decoder, rec, name, last=rec is run.steps[-1])


def _slots_table(rec: StepRecord, name) -> str:
    rows = []
    for j in range(1, rec.drafted + 2):  # slot j predicts the token in d_j's place; slot γ+1 is the bonus slot
        draft = rec.window[j] if j < len(rec.window) else None
        target = rec.target_tokens[j - 1] if j - 1 < len(rec.target_tokens) else None
        if j <= rec.accepted:
            verdict = "accepted"
        elif j == rec.accepted + 1:
            verdict = f"{'bonus' if draft is None else 'rejected'} → c = {name(rec.token)}"
        else:
            verdict = "not reached"
        cands = _topk_cells(rec, j - 1, name, highlight=rec.token if j == rec.accepted + 1 else None)
        rows.append(f"<tr><td>{j}</td><td><code>{html.escape(name(rec.window[j - 1]))}</code></td>"
                    f"<td><code>{'—' if draft is None else html.escape(name(draft))}</code></td>"
                    f"<td><code>{'—' if target is None else html.escape(name(target))}</code></td>"
                    f"<td>{html.escape(verdict)}</td><td>{cands}</td></tr>")
    return ("<table class='mirror-table'><tr><th>slot j</th><th>input</th><th>draft d_j</th><th>target argmax</th>"
            "<th>verdict</th><th>early-exit top-κ: p_exit (draft token d_j excluded)</th></tr>" + "".join(rows)
            + "</table>")


def _topk_cells(rec: StepRecord, slot: int, name, highlight: int | None) -> str:
    if slot >= len(rec.topk_ids):
        return "<i>none (no early exit)</i>"
    chips = []
    for token, logp in zip(rec.topk_ids[slot], rec.topk_logprobs[slot]):
        if token < 0:
            continue
        cls = "mirror-chip mirror-chip-hit" if token == highlight else "mirror-chip"
        chips.append(f"<span class='{cls}'><code>{html.escape(name(token))}</code> {math.exp(logp):.3f}</span>")
    return " ".join(chips) or "<i>none</i>"


def _branches(decoder: str, rec: StepRecord, name, last: bool) -> str:
    if decoder != "mirror":
        return ("<p><b>No branches</b>: vanilla SD has no early exit, so the next window is drafted only after "
                "verification (serial).</p>")
    if rec.hit is None:
        return ("<p><b>No branches</b>: the early-exit candidates did not reach the draft lane this step "
                "(the draft lane failed); the run continued on the target alone.</p>")
    slot = rec.accepted + 1
    if not rec.branches:
        why = "the run ended at this step (EOS or max new tokens), so no next window was needed" if last else \
              "the draft lane returned no branches"
        return f"<p><b>No branches used</b>: {why}.</p>"
    rows = list(rec.branch_rows)  # (slot index, candidate) of each branch row, from the engine
    if rec.hit and rec.branch_row is not None:
        verdict = (f"<b class='mirror-fast'>Hit</b>: c = <code>{html.escape(name(rec.token))}</code> is among slot "
                   f"τ = {slot}'s candidates, so branch row {rec.branch_row} became the next window at once "
                   f"(the draft lane adopted its KV cache; no rollout after verification).")
    else:
        verdict = (f"<b class='mirror-slow'>Miss → fallback</b>: c = <code>{html.escape(name(rec.token))}</code> is not "
                   f"among slot τ = {slot}'s κ candidates, so no precomputed branch starts with it; the draft lane "
                   f"rolled out γ fresh tokens after verification.")
    body = []
    for r, tokens in enumerate(rec.branches[:MAX_BRANCH_ROWS]):
        j, cand = rows[r] if r < len(rows) else (None, None)
        cls = " class='mirror-reused'" if r == rec.branch_row else ""
        text = " ".join(f"<code>{html.escape(name(t))}</code>" for t in tokens)
        body.append(f"<tr{cls}><td>{r}</td><td>{'?' if j is None else j + 1}</td>"
                    f"<td><code>{'?' if cand is None else html.escape(name(cand))}</code></td><td>{text}</td></tr>")
    more = "" if len(rec.branches) <= MAX_BRANCH_ROWS else f"<p>… {len(rec.branches) - MAX_BRANCH_ROWS} more rows</p>"
    return (f"<p>{verdict}</p><p>Branches precomputed during this step (a γ-token continuation per candidate, "
            f"rolled out while the target ran layers ℓ_e+1..N):</p><table class='mirror-table'><tr><th>row</th>"
            f"<th>slot</th><th>candidate c</th><th>branch tokens</th></tr>{''.join(body)}</table>{more}")
