"""The files a run writes next to its checkpoints and the predictor reads (its run folder):

- :data:`RUN_INFO` (``predictor.json``): written by training (:meth:`common.task.Task.run_info`): the class
  names of a classifier, the answer vocabulary of a VQA model.
- :data:`FEATURE_INFO` (``feature_extractor.json``): how the precomputed region features a model was trained
  on were made (``{"cfg": ..., "opts": [...], "weights": ..., "box_source": {"kind": ..., ...}}``, paths
  relative to the working folder, or, in a hand-off folder, to that folder), written by
  ``demo/run_demo_vqa.sh`` and :func:`common.checkpoint.features.write_feature_handoff`.
"""
import json
import os

from common.config.handoff_folder import is_handoff
from common.errors import UserInputError
from common.fileio.safe_write import atomic_write

# Files next to a checkpoint (module docstring).
RUN_INFO = "predictor.json"
FEATURE_INFO = "feature_extractor.json"


def write_run_info(folder, info):
    """Write ``info`` (a JSON-able dict; nothing when empty) as ``folder/predictor.json``, atomically."""
    if not info:
        return None
    path = os.path.join(folder, RUN_INFO)
    text = json.dumps(info, indent=1)
    atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text))
    return path


def run_folder(ckpt_path):
    """The folder of the files written beside a checkpoint (``predictor.json``, ``run.json``): the hand-off folder
    itself, else the folder holding the checkpoint file or the sharded checkpoint folder (an FSDP run's)."""
    if is_handoff(ckpt_path):
        return ckpt_path
    return os.path.dirname(os.path.normpath(os.path.abspath(ckpt_path)))


def read_run_info(ckpt_path, name=RUN_INFO):
    """The JSON file ``name`` of the checkpoint ``ckpt_path``'s :func:`run_folder` as a dict; ``{}`` when there
    is none.

    Raises:
        UserInputError: the file is not a JSON object (names it).
    """
    path = os.path.join(run_folder(ckpt_path), name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise UserInputError("{}: not a readable JSON file ({})".format(path, e)) from None
    if not isinstance(info, dict):
        raise UserInputError("{}: expected a JSON object".format(path))
    return info

