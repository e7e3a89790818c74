"""Losses of VL-BERT pretraining (MLM, MVRC) with the reference release's reductions."""
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


def reported_loss(loss, label):
    """``loss`` as the outputs dict reports it: NaN when ``label`` labels nothing, so a logged per-batch
    mean (:class:`common.metrics.loss_logger.LossLogger`) skips the batch instead of counting a 0 (the
    filler batches of a ``DATASET`` list's evaluation label nothing); ``loss`` itself otherwise. The loss
    the model trains on is not changed. No host sync.

    Args:
        loss: scalar tensor.
        label: the loss's labels: word ids [B, L] (-1 = none) or soft class targets [B, N, C] (a row
            summing to 1 is labelled), or None when the loss is off.
    """
    if label is None:
        return loss
    labelled = (label.sum(-1) - 1).abs() < SOFT_TARGET_TOL if label.is_floating_point() else label != -1
    return torch.where(labelled.any(), loss, torch.full_like(loss, float("nan")))
