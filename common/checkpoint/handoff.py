"""A pickle-free hand-off of a trained model: one folder that holds everything a predictor reads, as Hugging Face's
``save_pretrained`` writes one; it is copied anywhere and read from any working folder.

Layout (Hugging Face's convention of one folder per model, ``model.safetensors`` beside its config)::

    model.safetensors   the model's state dict, fp32, keys as in a checkpoint's ``state_dict``; its metadata
                        holds ``format`` ('pt'), ``task``, ``module`` and ``files`` (JSON: file -> config key)
    config.yaml         the checkpoint's resolved config; the keys of the files below name them relative to the
                        folder, the weight-initialisation files (:data:`INIT_WEIGHT_KEYS`) are empty
    bert/               the tokenizer's vocab.txt, the BERT config (checked against NETWORK.VLBERT) and the
                        casing (tokenizer_config.json) of NETWORK.BERT_MODEL_NAME; its weights are not needed
    predictor.json ...  the files of the checkpoint's run folder that the predictor reads (class names, answers)
    answers.txt, ...    the task's copies of files its config names (:meth:`common.task.Task.handoff_files`)
    feature_extractor.json, image_encoder.*   the image encoder of a model trained on precomputed region features
                        and its box source (:func:`common.checkpoint.features.write_feature_handoff`)

``common.engine.load_for_inference`` (``val.py``, ``test.py``) and ``common.inference.Predictor.from_checkpoint``
take such a folder wherever they take a checkpoint file; :meth:`common.task.Task.load_config` reads its
``config.yaml`` with the copied files' keys pointing at the copies
(:func:`common.config.handoff_folder.handoff_opts`).
"""
import json
import os

from common.modeling.nlp.bert_loading import CONFIG_FILES, VOCAB_FILE

from safetensors.torch import load_file, save

from common.checkpoint.checkpointer import model_state_fp32
from common.config import dump_config
from common.config.handoff_folder import CONFIG_FILE, WEIGHTS_FILE, handoff_metadata
from common.errors import CheckpointError
from common.fileio.safe_write import atomic_write

BERT_FOLDER = "bert"
# Files that only initialise weights the hand-off's model.safetensors holds: empty in its config.yaml.
INIT_WEIGHT_KEYS = ("NETWORK.BERT_PRETRAINED", "NETWORK.IMAGE_PRETRAINED", "NETWORK.PARTIAL_PRETRAIN")


def write_handoff(folder, task, cfg, model, run_files=()):
    """Write the hand-off folder of ``model`` (a ``task`` model built from ``cfg``) with copies of the files
    ``run_files`` (paths; those that do not exist are left out); files are written atomically.

    Returns:
        list of the written paths.
    Raises:
        OutputWriteError: a file cannot be written (names the folder and the cause).
        FileNotFoundError: the BERT folder the config names has no vocab.txt or config.
    """
    extra = task.handoff_files(cfg)
    texts = {name: text for name, (_, text) in extra.items()}
    keys = {name: key for name, (key, _) in extra.items()}
    bert = _config_value(cfg, "NETWORK.BERT_MODEL_NAME")
    if bert:
        texts.update(_bert_files(bert))
        keys[BERT_FOLDER] = "NETWORK.BERT_MODEL_NAME"
    metadata = {"format": "pt", "task": task.name, "module": cfg.MODULE, "files": json.dumps(keys)}
    data = save(model_state_fp32(model), metadata=metadata)
    paths = [os.path.join(folder, WEIGHTS_FILE), os.path.join(folder, CONFIG_FILE)]
    atomic_write(paths[0], lambda f: f.write(data), size_hint=len(data))
    saved = cfg.clone()
    saved.defrost()
    for key, value in [(k, n) for n, k in keys.items()] + [(k, "") for k in INIT_WEIGHT_KEYS]:
        if _config_value(cfg, key) is not None:
            _set_config_value(saved, key, value)
    dump_config(saved, paths[1])
    for path in run_files:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                texts[os.path.basename(path)] = f.read()
    for name, text in texts.items():
        paths.append(os.path.join(folder, name))
        atomic_write(paths[-1], lambda f, text=text: f.write(text), binary=False, size_hint=len(text))
    return paths


def _bert_files(name):
    """``{"bert/<file>": text}``: the vocabulary, the config and the casing of the BERT folder ``name`` (or of the
    folder of a vocab.txt path), which the folder's name may have decided (:mod:`common.data.tokenizer`)."""
    from common.data.tokenizer import _lower_case

    source = os.path.dirname(name) if os.path.isfile(name) else name
    config = next((c for c in CONFIG_FILES if os.path.isfile(os.path.join(source, c))), None)
    if config is None or not os.path.isfile(os.path.join(source, VOCAB_FILE)):
        raise FileNotFoundError("NETWORK.BERT_MODEL_NAME: BERT folder '{}' needs {} and one of {}".format(
            source, VOCAB_FILE, ", ".join(CONFIG_FILES)))
    files = {}
    for file in (VOCAB_FILE, config):
        with open(os.path.join(source, file), encoding="utf-8") as f:
            files[BERT_FOLDER + "/" + file] = f.read()
    files[BERT_FOLDER + "/tokenizer_config.json"] = json.dumps({"do_lower_case": _lower_case(source)})
    return files


def _config_value(cfg, key):
    """The value of the dotted ``key`` in ``cfg``, or None when the config has no such key."""
    node = cfg
    for part in key.split("."):
        if not hasattr(node, part):
            return None
        node = getattr(node, part)
    return node


def _set_config_value(cfg, key, value):
    *parents, last = key.split(".")
    node = cfg
    for part in parents:
        node = getattr(node, part)
    setattr(node, last, value)


def handoff_task_name(folder):
    """The task name the hand-off ``folder`` was written for (None for a folder written without one).

    Raises:
        CheckpointError: its weights file is unreadable.
    """
    return handoff_metadata(folder).get("task")


def handoff_config(folder, task, opts=()):
    """The frozen config of the hand-off ``folder`` for ``task``: its ``config.yaml``, with each copied file's
    config key set to the copy in the folder (:func:`common.config.handoff_folder.handoff_opts`), then ``opts``.

    Raises:
        CheckpointError: the folder was written for another task, or its weights file is unreadable.
        common.config.ConfigError: as :meth:`common.task.Task.load_config`.
    """
    metadata = handoff_metadata(folder)
    if metadata.get("task", task.name) != task.name:
        raise CheckpointError("{} holds a '{}' model, not a '{}' one".format(folder, metadata["task"], task.name))
    return task.load_config(os.path.join(folder, CONFIG_FILE), list(opts))


def read_handoff(folder):
    """The hand-off ``folder`` as a checkpoint dict: ``state_dict`` (CPU tensors) and ``config`` (YAML text).

    Raises:
        CheckpointError: the weights file is unreadable. FileNotFoundError: no ``config.yaml``.
    """
    handoff_metadata(folder)  # a clear error for a foreign or truncated file
    with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
        config = f.read()
    return {"state_dict": load_file(os.path.join(folder, WEIGHTS_FILE), device="cpu"), "config": config}
