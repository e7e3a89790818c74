"""Losses of the VL-BERT tasks with the reference release's reductions."""
import torch
import torch.nn.functional as F

# Rows whose soft target sums to 1 within this tolerance count as labelled (reference ``soft_cross_entropy``).
SOFT_TARGET_TOL = 0.1
# Added to the counts that normalise per-sample losses (reference value), so empty samples give 0, not NaN.
COUNT_EPS = 1e-4


def soft_cross_entropy(logits, target, reduction='mean'):
    """Cross-entropy against soft targets.

    Args:
        logits: [N, C]; target: [N, C] probabilities. Rows whose target does not sum to 1 are ignored.
        reduction: 'mean' (over labelled rows), 'sum', or 'none' ([N], 0 for ignored rows).
    Returns:
        loss tensor; 0 when no row is labelled.
    """
    valid = (target.sum(1) - 1).abs() < SOFT_TARGET_TOL
    per_row = -(F.log_softmax(logits.float(), dim=1) * target.float()).sum(1) * valid
    if reduction == 'none':
        return per_row
    if reduction == 'sum':
        return per_row.sum()
    if reduction == 'mean':
        return per_row.sum() / valid.sum().clamp(min=1)
    raise ValueError("reduction must be 'mean', 'sum' or 'none', got '{}'".format(reduction))


def smoothed_soft_targets(target, smoothing):
    """Label smoothing of unnormalised soft targets (VQA's answer scores), for a softmax cross-entropy.

    ``F.cross_entropy(..., label_smoothing=e)`` mixes each target row with ``e / C`` per class, which
    assumes rows that sum to 1: a VQA row of scores summing to ``S`` (0 for a question whose answers
    are all outside the vocabulary, up to several for a few accepted answers) would get ``e`` of
    uniform mass whatever ``S``, so an unlabelled row would be trained towards the uniform
    distribution. Here each row keeps its mass: a fraction ``e`` of it is spread evenly,

        smoothed = (1 - e) * target + e * S / C,      S = target.sum(1)

    so a row summing to 1 gives exactly ``F.cross_entropy(logits, target, label_smoothing=e)``, a
    row summing to 0 still adds no loss, and ``e = 0`` returns ``target`` itself.

    Args:
        target: [N, C] float, non-negative soft scores.
        smoothing: ``TRAIN.LABEL_SMOOTHING``, in [0, 1].
    Returns:
        [N, C] tensor of ``target``'s dtype (``target`` when ``smoothing`` is 0).
    """
    if smoothing == 0.0:
        return target
    return target * (1.0 - smoothing) + target.sum(1, keepdim=True) * (smoothing / target.shape[1])


def masked_lm_loss(logits, labels, norm_in_batch_first):
    """MLM cross-entropy over labelled positions (label -1 = not masked).

    Args:
        logits: [B, L, V]; labels: [B, L] long.
        norm_in_batch_first: average within each sample, then over samples that have labels
            (``MLM_LOSS_NORM_IN_BATCH_FIRST``); else average over all labelled positions.
    Returns:
        scalar loss (0 when nothing is labelled).
    """
    per_token = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-1, reduction='none')
    labelled = (labels != -1).to(per_token.dtype)
    if norm_in_batch_first:
        counts = labelled.sum(1, keepdim=True)
        return (per_token / (counts + COUNT_EPS)).sum() / ((counts != 0).sum() + COUNT_EPS)
    return per_token.sum() / labelled.sum().clamp(min=1)


def mvrc_loss(logits, labels, norm_in_batch_first):
    """Masked RoI classification loss with soft labels (detector class distribution).

    Args:
        logits: [B, N, C]; labels: [B, N, C], a distribution at masked RoIs, zeros elsewhere.
        norm_in_batch_first: average within each sample, then over samples with masked RoIs
            (``MVRC_LOSS_NORM_IN_BATCH_FIRST``); else average over all masked RoIs.
    Returns:
        scalar loss.
    """
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, labels.shape[-1])
    if not norm_in_batch_first:
        return soft_cross_entropy(flat_logits, flat_labels)
    per_roi = soft_cross_entropy(flat_logits, flat_labels, reduction='none').view(logits.shape[:-1])
    valid = ((labels.sum(-1) - 1).abs() < SOFT_TARGET_TOL).to(per_roi.dtype)
    counts = valid.sum(1, keepdim=True)
    return (per_roi / (counts + COUNT_EPS)).sum() / ((counts != 0).sum() + COUNT_EPS)


def pad_to(tensor, length, dim, value):
    """Pad ``tensor`` along ``dim`` with ``value`` up to ``length`` (no-op when already that long)."""
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat((tensor, tensor.new_full(shape, value)), dim)
