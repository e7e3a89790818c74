"""A pickle-free hand-off of a trained model: one folder with the weights as safetensors and the resolved config.

Layout (Hugging Face's convention of one folder per model, ``model.safetensors`` beside its config)::

    model.safetensors   the model's state dict, fp32, keys as in a checkpoint's ``state_dict``; its metadata
                        holds ``format`` ('pt'), ``task``, ``module`` and ``files`` (JSON: file -> config key)
    config.yaml         the checkpoint's resolved config (yacs YAML, as a run's output folder holds)
    predictor.json ...  the files of the checkpoint's run folder that the predictor reads (class names, answers,
                        how the region features were made), copied
    answers.txt, ...    the task's copies of files its config names (:meth:`common.task.Task.handoff_files`)

``common.engine.load_for_inference`` (``val.py``, ``test.py``) and ``common.predict.Predictor.from_checkpoint``
take such a folder wherever they take a checkpoint file; :func:`handoff_config` reads its config with the copied
files' keys pointing at the copies.
"""
import json
import os

from safetensors import safe_open
from safetensors.torch import load_file, save

from common.checkpoint import CheckpointError, model_state_fp32
from common.config import dump_config
from common.safe_write import atomic_write

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"


def is_handoff(path):
    """Whether ``path`` is a hand-off folder (a folder holding :data:`WEIGHTS_FILE`)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def write_handoff(folder, task, cfg, model, run_files=()):
    """Write the hand-off folder of ``model`` (a ``task`` model built from ``cfg``) with copies of the files
    ``run_files`` (paths; those that do not exist are left out); files are written atomically.

    Returns:
        list of the written paths.
    Raises:
        OutputWriteError: a file cannot be written (names the folder and the cause).
    """
    extra = task.handoff_files(cfg)
    metadata = {"format": "pt", "task": task.name, "module": cfg.MODULE,
                "files": json.dumps({name: key for name, (key, _) in extra.items()})}
    data = save(model_state_fp32(model), metadata=metadata)
    paths = [os.path.join(folder, WEIGHTS_FILE), os.path.join(folder, CONFIG_FILE)]
    atomic_write(paths[0], lambda f: f.write(data), size_hint=len(data))
    dump_config(cfg, paths[1])
    texts = {name: text for name, (_, text) in extra.items()}
    for path in run_files:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                texts[os.path.basename(path)] = f.read()
    for name, text in texts.items():
        paths.append(os.path.join(folder, name))
        atomic_write(paths[-1], lambda f, text=text: f.write(text), binary=False, size_hint=len(text))
    return paths


def _metadata(folder):
    path = os.path.join(folder, WEIGHTS_FILE)
    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
        raise CheckpointError("{} is not a readable safetensors file ({})".format(path, e)) from None


def handoff_config(folder, task, opts=()):
    """The frozen config of the hand-off ``folder`` for ``task``: its ``config.yaml``, with each extra file's
    config key set to the copy in the folder, then ``opts``.

    Raises:
        CheckpointError: the folder was written for another task, or its weights file is unreadable.
        common.config.ConfigError: as :meth:`common.task.Task.load_config`.
    """
    metadata = _metadata(folder)
    if metadata.get("task", task.name) != task.name:
        raise CheckpointError("{} holds a '{}' model, not a '{}' one".format(folder, metadata["task"], task.name))
    files = json.loads(metadata.get("files", "{}"))
    pointed = [x for name, key in files.items() if key for x in (key, os.path.join(folder, name))]
    return task.load_config(os.path.join(folder, CONFIG_FILE), pointed + list(opts))


def read_handoff(folder):
    """The hand-off ``folder`` as a checkpoint dict: ``state_dict`` (CPU tensors) and ``config`` (YAML text).

    Raises:
        CheckpointError: the weights file is unreadable. FileNotFoundError: no ``config.yaml``.
    """
    _metadata(folder)  # a clear error for a foreign or truncated file
    with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
        config = f.read()
    return {"state_dict": load_file(os.path.join(folder, WEIGHTS_FILE), device="cpu"), "config": config}
