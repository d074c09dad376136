"""Training losses for the bundled target, AR draft and SS draft (all means over token positions, in nats)."""
import torch
import torch.nn.functional as F


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits [B, T, V] at t against targets [B, T] (token t+1)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Forward KL(p_target || p_draft) per position: mass-covering, so the draft's top-1 chases the target's."""
    logp_target = F.log_softmax(target_logits.float(), dim=-1)  # [..., V]
    logp_draft = F.log_softmax(draft_logits.float(), dim=-1)  # [..., V]
    kl = (logp_target.exp() * (logp_target - logp_draft)).sum(-1)  # [...]
    return kl.mean()


def unlikelihood_loss(logits: torch.Tensor, targets: torch.Tensor, penalize: torch.Tensor) -> torch.Tensor:
    """Sequence-level unlikelihood (Welleck et al., 2020, §5.2): −log(1 − p(x_t | x_<t)) on the tokens of the
    model's own continuation that lie in a repeated n-gram, mean over those tokens (0 when there are none).

    logits [B, T, V] predict targets [B, T]; penalize [B, T] bool marks the repeated tokens.
    """
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    term = -torch.log1p(-logp.exp().clamp(max=1.0 - 1e-6))  # [B, T]
    return (term * penalize).sum() / penalize.sum().clamp(min=1)


def early_exit_loss(exit_logits: torch.Tensor, final_logits: torch.Tensor, targets: torch.Tensor,
                    ce_weight: float = 0.5, kl_weight: float = 0.5) -> torch.Tensor:
    """Auxiliary loss on the layer-ℓ_e logit-lens readout (final norm + tied head), LayerSkip-style.

    Why both terms: the engine branches on TopK(p_exit) and wins when the target's own token lies in
    it, so KL(p_target || p_exit) with p_target detached trains the readout on exactly that
    quantity (top-κ overlap Ω_κ, docs/ALGORITHM.md §1) without pulling the final layers towards the exit.
    Early in training p_target is still poor, so a CE term on the data (LayerSkip's exit loss)
    grounds the readout and also gives the lower half of the network a direct next-token signal.
    """
    ce = next_token_loss(exit_logits, targets)
    kl = distill_loss(exit_logits, final_logits.detach())
    return ce_weight * ce + kl_weight * kl


def speculative_streaming_loss(main_logits: torch.Tensor, stream_logits: torch.Tensor, targets: torch.Tensor,
                               stream_weight: float = 0.1, main_weight: float = 1.0,
                               target_logits: torch.Tensor | None = None) -> torch.Tensor:
    """SS loss L = α0·L_main + Σ_j α_j·CE(stream j at t, token t+1+j), α0 = 1, α_j = 0.1.

    main_logits [B, T, V]; stream_logits [B, T, n_str, V]; targets [B, T] with targets[:, t] = token t+1.
    L_main is CE on the data, or, when target_logits [B, T, V] is given, forward KL from the target
    (the distilled main stream). Stream j needs token t+1+j = targets[:, t+j], so its last j
    positions have no label and are skipped.
    """
    if target_logits is None:
        main = next_token_loss(main_logits, targets)
    else:
        main = distill_loss(main_logits, target_logits)
    total = main_weight * main
    t = targets.shape[1]
    for j in range(1, stream_logits.shape[2] + 1):
        total = total + stream_weight * next_token_loss(stream_logits[:, : t - j, j - 1], targets[:, j:])
    return total
