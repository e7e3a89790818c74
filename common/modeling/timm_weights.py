"""timm models by name and their weights from a local file: what the cls task's classifier and the VL-BERT
ViT image encoder share.

A model is ``timm.create_model(name, pretrained=False, **kwargs)`` (timm's "model by name with keyword
overrides"); its weights come from a timm ``.safetensors`` or ``.pth`` state dict read weights-only by
:func:`common.fileio.safe_load.load_tensors` (nothing in the file runs). Nothing downloads.
"""
from common.errors import UserInputError
from common.fileio.safe_load import load_tensors

__all__ = ["TimmWeightsError", "arch_kwargs", "load_timm_weights"]


class TimmWeightsError(UserInputError):
    """A weights file that is not one of the timm architecture the config names."""


def arch_kwargs(pairs, key="NETWORK.ARCH_KWARGS"):
    """A config list ``[[name, value], ...]`` (e.g. ``NETWORK.ARCH_KWARGS``) as the dict of keyword arguments
    of ``timm.create_model``.

    Raises:
        UserInputError: an entry that is not a ``[name, value]`` pair (the message names ``key``).
    """
    bad = [p for p in pairs if len(p) != 2 or not isinstance(p[0], str)]
    if bad:
        raise UserInputError("{}: expected [name, value] pairs, got {}".format(key, bad))
    return {name: value for name, value in pairs}


def load_timm_weights(model, path, arch, key="NETWORK.IMAGE_PRETRAINED"):
    """Load a timm state dict file into the timm ``model`` of architecture ``arch``.

    The file is a state dict (name -> tensor), possibly under ``state_dict`` or ``model`` (timm's training
    checkpoints). Its classifier (``model.pretrained_cfg['classifier']``, ``head`` for a ViT) may differ:
    when ``model`` has none (``num_classes=0``) the file's classifier keys are dropped; when its shape differs
    (another class count) the model's classifier keeps its random values and its keys are returned.

    Args:
        model: a model of ``timm.create_model(arch, ...)``.
        path: the ``.safetensors`` / ``.pth`` file.
        arch: the timm name the config gives, for messages.
        key: the config key naming ``path``, for messages.
    Returns:
        list of the model's classifier keys left random (shape differs), else empty.
    Raises:
        FileNotFoundError: no file at ``path``.
        common.fileio.safe_load.UnreadableFileError: unreadable, or it asks to run code (refused, not run).
        TimmWeightsError: keys missing or unexpected, or shapes that differ outside the classifier: the file
            holds another architecture; the message names ``arch``, the one expected.
    """
    state = load_tensors(path, what="{} weights".format(key))
    if isinstance(state, dict):
        state = state.get("state_dict", state.get("model", state))
    if not isinstance(state, dict):
        raise TimmWeightsError("{} = {}: expected a timm state dict (name -> tensor) of {}, got {}".format(
            key, path, arch, type(state).__name__))
    classifier = getattr(model, "pretrained_cfg", {}).get("classifier", "head")
    own = model.state_dict()

    def in_classifier(k):
        return k == classifier or k.startswith(classifier + ".")

    if not any(in_classifier(k) for k in own):  # a feature extractor: the file's classifier has no place
        state = {k: v for k, v in state.items() if not in_classifier(k)}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = {k: (tuple(v.shape), tuple(own[k].shape)) for k, v in state.items()
              if k in own and tuple(v.shape) != tuple(own[k].shape)}
    wrong_shape = {k: s for k, s in shapes.items() if not in_classifier(k)}
    if missing or unexpected or wrong_shape:
        raise TimmWeightsError(
            "{} = {} holds weights of another architecture than timm's {} (with the config's keyword arguments), "
            "the one expected: missing {}, unexpected {}, shapes (file, model) {}".format(
                key, path, arch, missing[:5], unexpected[:5], dict(list(wrong_shape.items())[:5])))
    model.load_state_dict({k: v for k, v in state.items() if k not in shapes}, strict=False)
    return sorted(shapes)
