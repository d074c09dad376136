"""Step inspector: one StepRecord → HTML (window, per-slot early-exit top-κ, branches, hit or why it fell back)."""
from __future__ import annotations

import html
import math

from mirror_core import StepRecord

from .render import count, drafts
from .session import DecoderRun, pick_step

MAX_BRANCH_ROWS = 64


def inspector_html(run: DecoderRun | None, step: float | None) -> str:
    if run is None or not run.steps:
        return "<p><i>Run SD or Mirror-SD, then pick a step to inspect.</i></p>"
    rec = pick_step(run, step or 1, 1)
    if isinstance(rec, str):
        return rec
    name = run.namer.show
    kind = "bonus" if rec.accepted == rec.drafted else "correction"
    if rec.drafted:
        head = (f"<p><b>Step {rec.step}</b>: the target verified W = [w0, {drafts(rec.drafted)}] in one pass, accepted "
                f"A_t = {rec.accepted}, and its {kind} c = <code>{html.escape(name(rec.token))}</code> sits at slot "
                f"s_t = A_t + 1 = {rec.accepted + 1} (slots 1..γ+1; slot γ+1 is the bonus); "
                f"{count(rec.committed, 'token')} committed. This window was " + window_source(rec) + "</p>")
    else:
        head = (f"<p><b>Step {rec.step}</b>: the target verified W = [w0] alone and committed its own token "
                f"<code>{html.escape(name(rec.token))}</code>, a plain step. This window was " + window_source(rec)
                + "</p>")
    sampling = run.start.settings.request.sampling if run.start else None
    rule = None if sampling is None or sampling.greedy else sampling.rule
    return head + _slots_table(rec, name, rule) + _branches(run.decoder, rec, name, last=rec is run.steps[-1])


def window_source(rec: StepRecord) -> str:
    """Where the window came from, and why it and its length were chosen (the latency model's terms)."""
    c = rec.context
    if rec.source == "zero":
        where = "<b>a window of zero</b>: no window was modelled to beat a plain step."
    elif rec.source == "context" and c is not None:
        where = (f"<b>copied from the context</b>: the last {c.match} committed tokens occurred before, and the "
                 f"{len(c.tokens)} tokens that followed them there were proposed (of {c.available} on offer); each "
                 f"copied token is accepted with q ≈ {c.q:.2f} at this match length (this run's count).")
    elif rec.from_branch:
        where = "<b>a reused branch</b> (a hit at the previous step)."
    else:
        where = "a fresh draft rollout."
    return where + ("" if rec.choice is None else " " + why_chosen(rec.choice))


SOURCE_WORDS = {"model": "the draft model's {n}-token window", "branch": "the adopted branch's first {n} tokens",
                "context": "a {n}-token context copy", "zero": "a plain step"}


def _offer(c) -> str:
    """'the draft model's 1-token window: 1.48 tokens in 7.10 ms (0.208 per ms)'."""
    return (SOURCE_WORDS[c.source].format(n=c.size) + f": {c.expected:.2f} token{'' if c.expected == 1 else 's'} "
            f"in {c.ms:.2f} ms ({c.per_ms:.3f} per ms)")


def why_chosen(choice) -> str:
    """The chooser's reasons (draft_choice.WindowChoice): what this window and the best other were modelled to give."""
    basis = "this run's own timings" if choice.measured else "the load's timings, before the run had timed any"
    if choice.promised:
        return (f"Promised at the step before: no token that step could commit would let the context offer a window, "
                f"so the target began this plain step without waiting for the draft lane's reply; {_offer(choice.chosen)}"
                + (f", against {_offer(choice.other)}" if choice.other is not None else "") + f" (modelled on {basis}).")
    if choice.probe:
        return (f"A probe: {_offer(choice.chosen)}, modelled to lose against {_offer(choice.other)}, proposed "
                f"anyway to measure the draft's acceptance again after a run of plain steps (modelled on {basis}).")
    other = f", against {_offer(choice.other)}" if choice.other is not None else ""
    return f"Why: {_offer(choice.chosen)}{other} (modelled on {basis})."


def _sampled(rec: StepRecord, j: int, draft: int | None, rule: str, name) -> str:
    """What the target drew at slot j when sampling: Rule E draws p_target at every slot up to the first mismatch
    (an accepted d_j is that draw); Rule R accepts d_j by a ratio test (no draw) and draws c from the residual."""
    if j <= rec.accepted:
        return f"= d_j ({html.escape(name(draft))})" if rule == "exact" else "none (ratio test passed)"
    if j == rec.accepted + 1:
        source = "p_target" if rule == "exact" or draft is None else "the residual max(0, p_target − p_draft)"
        return f"<code>{html.escape(name(rec.token))}</code> from {source}"
    return "not drawn"


def _slots_table(rec: StepRecord, name, rule: str | None = None) -> str:
    """One row per slot. At T > 0 (rule set) a column says what the target sampled, since its argmax is then only
    its likeliest token and can disagree with the verdict."""
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
        sampled = f"<td>{_sampled(rec, j, draft, rule, name)}</td>" if rule else ""
        rows.append(f"<tr><td>{j}</td><td><code>{html.escape(name(rec.window[j - 1]))}</code></td>"
                    f"<td><code>{'—' if draft is None else html.escape(name(draft))}</code></td>"
                    f"<td><code>{'—' if target is None else html.escape(name(target))}</code></td>{sampled}"
                    f"<td>{html.escape(verdict)}</td><td>{cands}</td></tr>")
    sample_head = (f"<th>target sampled (Rule {'E' if rule == 'exact' else 'R'})</th>" if rule else "")
    note = ("<p class='mirror-def'>At T > 0 the target samples: its argmax is only its likeliest token, so it can "
            "differ from the verdict; the sampled column is what decided it.</p>" if rule else "")
    return ("<table class='mirror-table'><tr><th>slot j</th><th>input</th><th>draft d_j</th><th>target argmax</th>"
            f"{sample_head}<th>verdict</th><th>early-exit top-κ: p_exit (draft token d_j excluded)</th></tr>"
            + "".join(rows) + "</table>" + note
            + "<p class='mirror-def'>Why d_j is not among slot j's candidates: if the target keeps d_j, the window "
              "itself goes on; a branch is needed only for a token the target could put in d_j's place.</p>")


def _topk_cells(rec: StepRecord, slot: int, name, highlight: int | None) -> str:
    if slot >= len(rec.topk_ids):
        return "<i>none (no early exit)</i>"
    chips = []
    rolled = {(j, v) for j, v in rec.branch_rows}
    for token, logp in zip(rec.topk_ids[slot], rec.topk_logprobs[slot]):
        if token < 0:
            continue
        pruned = bool(rolled) and (slot, token) not in rolled  # the branch budget left it without a rollout
        cls = "mirror-chip" + (" mirror-chip-hit" if token == highlight else "") + (" mirror-chip-pruned" if pruned else "")
        chips.append(f"<span class='{cls}'><code>{html.escape(name(token))}</code> {math.exp(logp):.3f}"
                     + (" <i>pruned (budget)</i>" if pruned else "") + "</span>")
    return " ".join(chips) or "<i>none</i>"


def _no_branches(decoder: str, rec: StepRecord) -> str:
    """Why a step had no branches at all ('' where it had candidates on the draft lane)."""
    if decoder != "mirror":
        return ("<p><b>No branches</b>: vanilla SD has no early exit, so the next window is drafted only after "
                "verification (serial).</p>")
    if rec.source == "zero":
        return ("<p><b>No branches</b>: a window of zero sends no candidates; the target took a plain step on AR's "
                "cores while the draft lane had nothing to roll out.</p>")
    if rec.hit is None:
        return ("<p><b>No branches</b>: the early-exit candidates did not reach the draft lane this step "
                "(the draft lane failed); the run continued on the target alone.</p>")
    return ""


def _branches(decoder: str, rec: StepRecord, name, last: bool) -> str:
    if none := _no_branches(decoder, rec):
        return none
    slot = rec.accepted + 1
    if not rec.branches:
        why = "the run ended at this step (EOS or max new tokens), so no next window was needed" if last else \
              "the draft lane returned no branches"
        return f"<p><b>No branches used</b>: {why}.</p>"
    rows = list(rec.branch_rows)  # (slot index, candidate) of each branch row, from the engine
    if rec.hit and rec.branch_row is not None:
        verdict = (f"<b class='mirror-fast'>Hit</b>: c = <code>{html.escape(name(rec.token))}</code> is among slot "
                   f"s_t = {slot}'s candidates, so branch row {rec.branch_row} became the next window at once "
                   f"(the draft lane adopted its KV cache; no rollout after verification).")
    else:
        verdict = (f"<b class='mirror-slow'>Miss → fallback</b>: c = <code>{html.escape(name(rec.token))}</code> is not "
                   f"among slot s_t = {slot}'s κ candidates, so no precomputed branch starts with it; the next window "
                   f"came without one (a fresh rollout, a context copy or a window of zero: the next step says).")
    by_slot: dict[int, list[int]] = {}  # the shown rows, grouped by slot: only slot s_t's rows can be reused
    for r in range(min(len(rec.branches), len(rows), MAX_BRANCH_ROWS)):
        by_slot.setdefault(rows[r][0], []).append(r)
    body = []
    for j, members in sorted(by_slot.items()):
        reachable = j + 1 == slot
        why = ("the correction's slot s_t: the branch starting with c is reusable" if reachable else
               f"unreachable this step: the target's correction landed at slot s_t = {slot}, so no branch of slot "
               f"{j + 1} can follow the committed text")
        body.append(f"<tr class='mirror-slot-head{'' if reachable else ' mirror-unreachable'}'><th colspan='3'>"
                    f"slot {j + 1} · {len(members)} branch(es) · {html.escape(why, quote=False)}</th></tr>")
        for r in members:
            cls = "mirror-reused" if r == rec.branch_row else ("" if reachable else "mirror-unreachable")
            text = " ".join(f"<code>{html.escape(name(t))}</code>" for t in rec.branches[r])
            body.append(f"<tr class='{cls}'><td>{r}</td><td><code>{html.escape(name(rows[r][1]))}</code></td>"
                        f"<td>{text}</td></tr>")
    more = "" if len(rec.branches) <= MAX_BRANCH_ROWS else f"<p>… {len(rec.branches) - MAX_BRANCH_ROWS} more rows</p>"
    return (f"<p>{verdict}</p><p>Branches precomputed during this step (a γ-token continuation per candidate, "
            f"rolled out while the target ran layers ℓ_e+1..N), grouped by the slot whose candidate starts them:</p>"
            f"<table class='mirror-table'><tr><th>row</th><th>candidate c</th><th>branch tokens</th></tr>"
            f"{''.join(body)}</table>{more}")
