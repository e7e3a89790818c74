"""The image encoder of a model trained on precomputed region features, as its run folder records it
(:data:`common.checkpoint.run_files.FEATURE_INFO`), and its copy in a hand-off folder."""
import json
import os

import torch
from safetensors.torch import save as save_safetensors

from common.checkpoint.run_files import FEATURE_INFO, read_run_info
from common.config import ConfigError, dump_config
from common.config.handoff_folder import is_handoff
from common.data.box_sources import DEFAULT_DETECTOR
from common.errors import UserInputError
from common.fileio.safe_load import load_tensors
from common.fileio.safe_write import atomic_write
from common.modeling.region_extractor import EXTRACTOR_OPTS

# Boxes of a photo given without boxes when neither the call nor the run folder names a box source.
DEFAULT_GRID = "4x4"


def feature_record(ckpt_path):
    """The run's :data:`FEATURE_INFO` record of ``ckpt_path`` (``{}`` when there is none), its paths usable from
    here: a hand-off folder's are relative to the folder, a run folder's to the working folder."""
    info = read_run_info(ckpt_path, FEATURE_INFO)
    if not is_handoff(ckpt_path):
        return info

    def inside(path):
        return os.path.join(ckpt_path, path) if path and not os.path.isabs(path) else path

    info = dict(info, **{k: inside(info[k]) for k in ("cfg", "weights") if info.get(k)})
    box = info.get("box_source")
    if isinstance(box, dict) and box.get("detector_weights"):
        info["box_source"] = dict(box, detector_weights=inside(box["detector_weights"]))
    return info


def feature_config(task, cfg, info):
    """The image encoder's config of a feature record: the recorded one, else the model's own
    (demo/run_demo_vqa.sh passes it to both), with :data:`EXTRACTOR_OPTS` and no IMAGE_PRETRAINED."""
    opts = list(info.get("opts", [])) + list(EXTRACTOR_OPTS) + ["NETWORK.IMAGE_PRETRAINED", ""]
    if not info.get("cfg"):
        return _encoder_cfg(cfg)
    try:
        return task.load_config(info["cfg"], opts)
    except ConfigError as e:
        raise UserInputError("{} 'cfg' (the config of the image encoder that made the region features): {}".format(
            FEATURE_INFO, e)) from None


# The image encoder in a hand-off folder (write_feature_handoff).
ENCODER_WEIGHTS = "image_encoder.safetensors"
ENCODER_CONFIG = "image_encoder.yaml"


def write_feature_handoff(task, cfg, ckpt_path, folder):
    """Write into the hand-off ``folder`` what the run's feature record (:func:`feature_record`) names: the image
    encoder's weights (:data:`ENCODER_WEIGHTS`, safetensors; a file that is not a flat state dict is copied as
    it is), its resolved config (:data:`ENCODER_CONFIG`) and :data:`FEATURE_INFO` naming them relative to the
    folder. A 'file' box source lists the run's training photos only: the hand-off records its fallback (a
    :data:`DEFAULT_GRID` grid when it names none) for new photos; a detector's weights are copied.

    Returns:
        ``(written paths, notes)``: notes are sentences for the user (what became of the box source).
    Raises:
        UserInputError: the recorded weights are unreadable. OutputWriteError: a file cannot be written.
    """
    info = feature_record(ckpt_path)
    if not info:
        return [], []
    record, paths, notes = {"opts": []}, [], []
    if info.get("weights"):
        record["weights"] = _copy_weights(info["weights"], folder, ENCODER_WEIGHTS, paths)
    paths.append(os.path.join(folder, ENCODER_CONFIG))
    dump_config(feature_config(task, cfg, info), paths[-1])
    record["cfg"] = ENCODER_CONFIG
    box = info.get("box_source")
    if box and box.get("kind") == "file":
        fallback = box.get("fallback") or {"kind": "grid", "grid": DEFAULT_GRID}
        notes.append("the run's box source, the box file(s) {}, lists the photos the model was trained on; the "
                     "hand-off gives new photos its recorded fallback, {}".format(
                         ", ".join(box.get("box_files", [])), _describe_record(fallback)))
        box = fallback
    if box and box.get("detector_weights"):
        name = "detector" + os.path.splitext(box["detector_weights"])[1]
        box = dict(box, detector_weights=_copy_weights(box["detector_weights"], folder, name, paths, convert=False))
    if box:
        record["box_source"] = box
    text = json.dumps(record, indent=1)
    paths.append(os.path.join(folder, FEATURE_INFO))
    atomic_write(paths[-1], lambda f: f.write(text), binary=False, size_hint=len(text))
    return paths, notes


def _describe_record(record):
    """A box source record in words, as :meth:`BoxSource.describe` (without building a detector)."""
    if record.get("kind") == "grid":
        return "grid {}".format(record.get("grid", DEFAULT_GRID))
    return "{} {}".format(record.get("kind"), record.get("detector", DEFAULT_DETECTOR))


def _copy_weights(source, folder, name, paths, convert=True):
    """Copy the weights file ``source`` into ``folder`` as ``name`` (``convert``: a flat state dict as
    safetensors, else the file as it is, under its own extension); returns the name, appends the path."""
    state = load_tensors(source, "{} weights".format(FEATURE_INFO)) if convert else None
    if isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values()):
        data = save_safetensors({k: v.contiguous() for k, v in state.items()})
    else:
        name = os.path.splitext(name)[0] + os.path.splitext(source)[1]
        with open(source, "rb") as f:
            data = f.read()
    paths.append(os.path.join(folder, name))
    atomic_write(paths[-1], lambda f: f.write(data), size_hint=len(data))
    return name


def _encoder_cfg(cfg):
    """A frozen copy of the model's config with :data:`EXTRACTOR_OPTS` applied and no IMAGE_PRETRAINED."""
    out = cfg.clone()
    out.defrost()
    out.NETWORK.IMAGE_FEAT_PRECOMPUTED = False
    out.NETWORK.IMAGE_SEMANTIC = False
    out.NETWORK.IMAGE_PRETRAINED = ""
    out.freeze()
    return out
