"""The glossary: every term and symbol the page uses, in one line each (the Learn tab shows it; tests check that the
figures shown on the page are defined here). Symbols follow docs/ALGORITHM.md §1."""
from __future__ import annotations

from ..numbers import NOISY_CORES

GLOSSARY = (
    ("window", "The γ+1 tokens the target runs in one forward: the last committed token w0 and the γ draft tokens "
               "d1..dγ it verifies (so a window has γ+1 rows, and γ+1 slots)."),
    ("early exit (ℓ_e)", "A layer part-way through the target where its hidden state is read out through the final "
                         "norm and LM head, before the remaining layers run."),
    ("κ", "How many next-token candidates per window slot the early exit sends to the draft (its top-κ)."),
    ("branch", "A γ-token continuation the draft rolls out for one candidate while the target finishes its layers."),
    ("hit", "The target's correction (or bonus) token was a candidate: its precomputed branch is the next window."),
    ("fallback", "No branch matched: the draft rolls out a fresh window after verification (a miss)."),
    ("τ", "The mean tokens committed per verification step, the bonus or correction token included (Σ n_t / "
          "#steps). Only the mean: one step's count has its own symbol, s_t."),
    ("τ flat beyond γ = 1", "When the draft rarely gets its first token right, a longer window adds nothing: d2 counts "
                            "only if d1 was accepted, so τ(γ) = 1 + a_1 + a_1·a_2 + … stays near 1 + a_1 and the "
                            "γ experiment's τ line is flat while each longer window still costs verification time."),
    ("α_i (n)", "Per-position acceptance: #(A_t ≥ i) / #(D_t ≥ i), the share of windows that offered draft position "
                "i whose first i tokens were all accepted; n = #(D_t ≥ i), the windows counted (a position past γ "
                "is offered only by a longer context window, so its n is small)."),
    ("τ(γ) from α_i", "1 + α_1 + … + α_γ: the tokens a step of γ draft tokens commits at the per-position "
                      "acceptances (the mean A_t plus the correction or bonus); τ itself when every window had γ."),
    ("slot", "Slot j (1..γ+1) holds the target's check of draft token d_j: the token it would put in d_j's place. Slot "
             "γ+1 is the bonus slot, after the last draft token. Every view numbers slots 1..γ+1."),
    ("A_t, D_t", "At step t: D_t draft tokens presented (γ) and A_t of them accepted (0..γ), first to last until the "
                 "first rejection."),
    ("s_t = A_t + 1", "The 1-based slot where step t's correction or bonus c sits, and the tokens that step committed "
                      "(unless the run ends inside it). τ is its mean over the steps."),
    ("c", "The target's own token at slot s_t: the correction (it replaced a rejected d_j) or the bonus."),
    ("bonus", "The target's token after a fully accepted window (A_t = γ), at slot γ+1: a token no draft proposed."),
    ("T_pre", "Time of the target's layers 1..ℓ_e over the window (measured per step)."),
    ("Δ", "Time of the target's layers ℓ_e+1..N and its LM head: the overlap budget the draft's branches hide in."),
    ("T_rv", "Rendezvous overheads: T_rv^ee (the early-exit readout and sending M_t) plus T_rv^fv (acceptance and "
             "adopting a branch)."),
    ("M_t", "The early-exit message of step t: each slot's top-κ candidate ids, sent to the draft lane mid-pass."),
    ("branch budget", "How many branch rows the draft rolls out per step, the likeliest candidates first (0 = all "
                      "κ(γ+1); auto = as many as finish during Δ). Pruned candidates cannot hit; the output never "
                      "changes."),
    ("exit head", "A small trained readout of the target's layer-ℓ_e hidden state (instead of the final norm and LM "
                  "head, the logit lens) that guesses the target's final token better."),
    ("feature-reading draft", "An EAGLE-style draft that reads the target's layer-ℓ_e hidden states (sent with M_t) "
                              "beside the token ids, so it predicts the target's tokens more often."),
    ("context draft", "Windows copied from the prompt and the output so far: after a run of tokens that occurred "
                      "before, propose what followed it there (yellow tokens). Nearly free, and long where the answer "
                      "copies (an edited function, a corrected text, a converted table); the model drafts elsewhere."),
    ("where speculation pays", "Where the next tokens are predictable at a small cost: copied text (the context "
                               "draft), boilerplate and repeats. On open prose a 135 M draft agrees with the target "
                               "too rarely for verification to pay back, and no decoder can beat AR by much."),
    ("window source", "Where a verified window came from: a fresh rollout of the draft model, a branch adopted on a "
                      "hit, a copy from the context, or none (a window of zero); the numbers table counts each "
                      "(steps, accepted/proposed, mean accepted run)."),
    ("window of zero", "A step with no draft tokens: the target verifies [w0] alone and commits its own token, a "
                       "plain step. Taken (Zero windows on) where no window, of any source and length up to γ, is "
                       "modelled on the run's own costs and acceptance to commit more tokens per millisecond; a "
                       "1-token probe window re-measures the draft now and then. Never changes the output."),
    ("format", "The function the target computes (its weights' and activations' number format: int8 as llama.cpp "
               "computes a GGUF, float32, bfloat16, float16): the text's author. Every decoder emits this function's "
               "tokens; another format is another function, with other tokens where the two disagree."),
    ("top-1 agreement", "Between two formats of one target, run over the same fixed text: the share of its positions "
                        "where both put the same token first (scripts/format_quality.py)."),
    ("perplexity change", "How much more (or less) surprised a format is by the same fixed text than float32: the "
                          "relative change of exp(mean negative log-likelihood per token)."),
    ("other processes", "The noise meter: the CPU time processes other than the page's (and its draft lane's) "
                        "used while a run was timed, ÷ its wall time, in % of one core. Above "
                        f"{NOISY_CORES:.0%} of a core the verdict says "
                        "the figures are not clean and shows the repeats' spread beside it."),
    ("row plan", "How the target splits a window into calls of measured row counts so that every position's logits "
                 "are bit-identical to a one-token step's: what keeps every decoder's tokens AR's on this CPU."),
    ("α", "Acceptance rate: accepted draft tokens over drafted tokens."),
    ("Ω̂", "Early-exit overlap: how often the target's final token is among the early exit's top-κ."),
    ("draft-hidden fraction", "The share of the draft lane's busy time that overlapped the target's work."),
    ("TTFT", "Time to first token: from the start of a run to its first committed token (the prefill)."),
    ("Vanilla SD", "Speculative decoding without the mirror: the draft rolls out serially after each verification."),
    ("SS draft", "A speculative-streaming draft: extra lookahead streams propose several tokens per forward."),
    ("Rule E / Rule R", "At T > 0: exact match against the target's sample (E), or rejection sampling (R): different "
                        "text, same distribution."),
    ("modelled", "Computed from a model, not timed: the latency model (docs/ALGORITHM.md §4), or the roofline's "
                 "larger limit."),
    ("weight bytes per token", "The bytes of weights one target forward reads: every layer's linear maps and the LM "
                               "head, whatever the number of rows."),
    ("read bandwidth", "How many GB/s the target lane streams from memory (one thread on the kernel), measured when the pair loads."),
    ("roofline step", "Weight bytes per token ÷ read bandwidth: the least one target step can cost here (the memory "
                      "limit, flat in rows)."),
    ("share of the roofline", "Roofline step ÷ the measured AR step: 100% means the step runs at the memory limit."),
    ("window cost", "At load, on the target lane: a forward of that many new rows ÷ the lane's one-row forward "
                    "(the roofline's): ≈ 1 while the pass is memory-bound."),
    ("compute limit", "2 × rows × the linear maps' multiply-adds ÷ their peak rate measured at load (GFLOP/s): the "
                      "least the arithmetic of that many rows can cost (rising with rows)."),
    ("ridge", "The number of rows where the compute limit meets the memory limit: below it an extra row is nearly "
              "free, past it each row costs its arithmetic."),
    ("verify cost", "What verifying a window of γ+1 tokens costs, in AR steps (÷ T_AR), defined once each under the "
                    "Run tab's verdict: the window at load (the figure the choice of γ, κ used), the window in a run "
                    "(T_pre + Δ: the speedup curve's x axis and the what-if's *Window γ+1 ÷ T_AR* knob), the "
                    "verification (+ the readout T_rv^ee) and the whole step (≈ 1 on an accelerator, more on a CPU)."),
    ("T_AR", "AR's one-token step on the cores AR runs on (every core where that is fastest): the AR run's mean, or "
             "at load the baseline's step timed then. Every speedup and every 'AR steps' figure is against it."),
    ("provisional verdict", "The verdict from the repeats timed so far, while the others still run; it updates as "
                            "each repeat ends."),
    ("break-even verify cost", "The verify cost up to which the latency model puts Mirror-SD at or above 1× AR at the "
                               "knobs' other values (modelled)."),
    ("you are here", "The speedup curve's point at the what-if's knobs: this machine's run or load, or the start chosen."),
    ("recorded example", "A real run of AR, vanilla SD and Mirror-SD on the default pair, shipped in "
                         "assets/learn_example/ so the Learn tab works before any run; its times are the recording "
                         "machine's, named on the page."),
    ("accelerator-shaped timeline", "A run's steps re-timed as the accelerator view models them (the window at one "
                                    "AR step, the readout with it, the branch batch at most one fresh rollout, the "
                                    "rest as measured): modelled, not measured."),
    ("accelerator view", "The curve's *verify ≈ 1 step* switch: the window costs one AR step, the readout and "
                         "messages shrink with it, the draft's branch batch runs on a device of its own; T_AR, the "
                         "exit split, the draft's time per token, τ, FF and γ stay (modelled)."),
    ("load-time timings", "The target's and draft's forwards timed when the pair loaded on this machine (step, "
                          "window, branch rows, forward by rows): what the what-if starts from before any run."),
)
