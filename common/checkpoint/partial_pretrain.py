"""NETWORK.PARTIAL_PRETRAIN: fine-tuning from a pretraining checkpoint (the reference release's rules).

The file's keys are renamed by NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES, then by the task's own renames
(:meth:`common.task.Task.pretrain_renames`, kept next to the model they rename), and every key the model
has is copied. Unlike a resume (:mod:`common.checkpoint.checkpointer`) the match is partial: the report lists what
was loaded, what the file has that the model lacks, and what stays at its initial value.
"""
import logging
from dataclasses import dataclass, field
from typing import List

from common.checkpoint.checkpointer import load_checkpoint_file, match_key
from common.errors import CheckpointError, UserInputError

logger = logging.getLogger("vlbert.checkpoint")  # the checkpoint logger: its lines go to the run's log file


@dataclass
class PartialLoadReport:
    """Keys (model names) loaded from the file, file keys with no place in the model, and model
    keys left at their initial values."""
    loaded: List[str] = field(default_factory=list)
    unmatched: List[str] = field(default_factory=list)
    not_loaded: List[str] = field(default_factory=list)


def _strip_module(key):
    return key[len("module."):] if key.startswith("module.") else key


def parse_prefix_changes(prefix_changes):
    """``["old->new", ...]`` (NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES) -> list of (old, new).

    Raises:
        ValueError: an entry without exactly one ``->``.
    """
    pairs = []
    for entry in prefix_changes:
        parts = entry.split("->")
        if len(parts) != 2:
            raise ValueError("NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES: expected 'old_prefix->new_prefix', "
                             "got {!r}".format(entry))
        pairs.append((parts[0], parts[1]))
    return pairs


def pretrain_state_for_finetune(state_dict, prefix_changes=(), renames=None, source="pretrain checkpoint"):
    """Rename a pretraining state dict for a fine-tuning model, as the reference release did.

    1. Each key takes the first prefix change whose old prefix it starts with (rules apply to
       the raw keys, ``module.`` included), then loses any ``module.`` prefix.
    2. ``renames(parsed, raw, source)``, the task's own renames (:meth:`common.task.Task.pretrain_renames`),
       gets the renamed fp32 tensors and the file's tensors under their own names.

    Args:
        state_dict: the file's ``state_dict`` (any dtype, ``module.`` keys or not).
        source: names the file in the task's errors.
    Returns:
        dict of renamed fp32/int tensors.
    """
    rules = parse_prefix_changes(prefix_changes)
    parsed = {}
    for k, v in state_dict.items():
        for old, new in rules:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        parsed[_strip_module(k)] = v.float() if v.is_floating_point() else v
    if renames is not None:
        parsed = renames(parsed, {_strip_module(k): v for k, v in state_dict.items()}, source)
    return parsed


def load_partial_pretrain(model, path, prefix_changes=(), renames=None, check=None):
    """NETWORK.PARTIAL_PRETRAIN: copy the matching weights of a pretraining checkpoint into ``model``.

    Keys are renamed by :func:`pretrain_state_for_finetune`; each one found in the model (with
    or without ``module.``) is copied, cast to the model's dtype. The counts and lists of loaded,
    unmatched and initial-value keys are logged (``vlbert.checkpoint``: the run's log file).

    ``check(ckpt, path)``, when given, sees the file's dict first (:meth:`common.task.Task.check_checkpoint`).

    Returns:
        PartialLoadReport.
    Raises:
        CheckpointError: not a checkpoint, or a matched key whose shape differs from the model's; what
            ``check`` raises.
    """
    ckpt = load_checkpoint_file(path)
    if check is not None:
        check(ckpt, path)
    source = ckpt["state_dict"]
    parsed = pretrain_state_for_finetune(source, prefix_changes, renames, source=path)
    target = model.state_dict()
    report, update = PartialLoadReport(), {}
    for k, v in parsed.items():
        mk = match_key(k, target)
        if mk is None:
            report.unmatched.append(k)
            continue
        if v.shape != target[mk].shape:
            raise CheckpointError("{}: {} has shape {} in the checkpoint but {} in the model".format(
                path, k, tuple(v.shape), tuple(target[mk].shape)))
        update[mk] = v.to(target[mk].dtype)
        report.loaded.append(mk)
    report.not_loaded = [k for k in target if k not in update]
    model.load_state_dict(update, strict=False)
    logger.info("[Partial Load] %s: %d keys loaded, %d keys of the file not matched, %d model keys left at init",
                path, len(report.loaded), len(report.unmatched), len(report.not_loaded))
    logger.info("[Partial Load] loaded keys: %s", report.loaded)
    logger.info("[Partial Load] non matched keys: %s", report.unmatched)
    logger.info("[Partial Load] non pretrain keys (left at init): %s", report.not_loaded)
    return report


# A VCR model runs its VL-BERT per answer choice inside TimeDistributed: its keys read vlbert._module.*.
BACKBONE_PREFIX_CHANGES = ("module.vlbert._module.->vlbert.", "vlbert._module.->vlbert.")
# VL-BERT parts that attention does not depend on: the pretraining heads and the pooler.
NOT_BACKBONE_PREFIXES = ("vlbert.mlm_head.", "vlbert.mvrc_head.", "vlbert.relationsip_head.", "vlbert.pooler.")


def _is_backbone(key):
    return key.startswith("vlbert.") and not key.startswith(NOT_BACKBONE_PREFIXES)


def _by_prefix(keys):
    """``{'vlbert': 40, 'image_feature_extractor': 2}``: how many keys under each first name."""
    counts = {}
    for k in keys:
        counts[k.split(".")[0]] = counts.get(k.split(".")[0], 0) + 1
    return counts


def load_vlbert_backbone(model, path, prefix_changes=()):
    """Copy the VL-BERT and image-encoder weights of any VL-BERT task's checkpoint into ``model``.

    Pretraining, VCR (``vlbert._module.*``, renamed by :data:`BACKBONE_PREFIX_CHANGES`), VQA and RefCOCO+
    checkpoints share the names ``vlbert.*`` (embeddings, encoder), ``image_feature_extractor.*`` and
    ``object_linguistic_embeddings.*``; task heads (a task's classifier, the pretraining heads, the pooler) have no
    place in ``model`` and are ignored. Loaded through :func:`load_partial_pretrain` (``prefix_changes``, e.g.
    NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES, apply first).

    Args:
        model: a model whose VL-BERT is ``model.vlbert`` (e.g. ``ResNetVLBERTForAttentionVis``).
        path: the checkpoint (a dict with ``state_dict``, fp16 or fp32, ``module.`` keys or not).
    Returns:
        PartialLoadReport; image-encoder keys the file lacks keep their initial weights (logged as a warning).
    Raises:
        UserInputError: the file has no VL-BERT weights; or its VL-BERT differs from the config's (model keys it
            lacks, or keys the model lacks: another depth, ``word_embedding_frozen``, ``visual_size``, ...), named
            with the file.
        common.errors.CheckpointError: unreadable file, or a key of another shape (names both shapes).
    """
    report = load_partial_pretrain(model, path, tuple(prefix_changes) + BACKBONE_PREFIX_CHANGES)
    wanted = [k for k in model.state_dict() if _is_backbone(k)]
    missing = [k for k in wanted if k not in report.loaded]
    if len(missing) == len(wanted):
        raise UserInputError("{}: no VL-BERT weights (keys vlbert.*, or vlbert._module.* of a VCR checkpoint); the "
                             "file's keys start with {}".format(path, _by_prefix(report.unmatched)))
    extra = [k for k in report.unmatched if _is_backbone(k)]
    if missing or extra:
        raise UserInputError("{}: its VL-BERT does not match the config's NETWORK.VLBERT (set the keys of the "
                             "checkpoint's config with --opts): model keys not in the file: {}; file keys not in "
                             "the model: {}".format(path, missing[:8], extra[:8]))
    image_missing = [k for k in report.not_loaded if k.startswith("image_feature_extractor.")]
    if image_missing:
        logger.warning("%s: %d image-encoder weights are not in the file and keep their initial values "
                       "(NETWORK.IMAGE_PRETRAINED or random), e.g. %s", path, len(image_missing), image_missing[:3])
    return report
