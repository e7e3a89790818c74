"""The layout of a hand-off folder (:mod:`common.checkpoint.handoff`) as far as its config needs it: a
``config.yaml`` beside ``model.safetensors``, whose metadata maps each copied file to the config key it replaces."""
import json
import os

from safetensors import safe_open

from common.errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"


def is_handoff(path):
    """Whether ``path`` is a hand-off folder (a folder holding :data:`WEIGHTS_FILE`)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def handoff_opts(config_path):
    """``[KEY, PATH, ...]``: each copied file's config key and the copy's path, when ``config_path`` is the
    ``config.yaml`` of a hand-off folder; ``[]`` otherwise."""
    if not config_path or os.path.basename(config_path) != CONFIG_FILE:
        return []
    folder = os.path.dirname(os.path.abspath(config_path))
    if not is_handoff(folder):
        return []
    files = json.loads(handoff_metadata(folder).get("files", "{}"))
    return [x for name, key in files.items() if key for x in (key, os.path.join(folder, name))]


def handoff_metadata(folder):
    """The metadata of the hand-off ``folder``'s weights file (``{}`` when it holds none).

    Raises:
        CheckpointError: the file is not a readable safetensors file.
    """
    path = os.path.join(folder, WEIGHTS_FILE)
    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
        raise CheckpointError("{} is not a readable safetensors file ({})".format(path, e)) from None
