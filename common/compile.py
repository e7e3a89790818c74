"""Opt-in ``torch.compile`` of a model's forward (``TRAIN.COMPILE``), with a fallback to eager mode.

The model is compiled in place (its ``forward`` becomes the compiled one), so ``state_dict`` keys,
checkpoints and DDP wrapping are those of the eager model. ``torch.compile`` fails late, on the first
call (no C++ compiler for the inductor backend, an op it cannot trace, an old Python): the first
failing call logs one warning naming the key and the cause, puts the eager forward back and reruns
the batch in eager mode, and training goes on. An error of the model itself then shows up from the
eager forward, as it would without the key.
"""
import functools

import torch

from common.runtime.logs import get_logger

logger = get_logger(__name__)


def compile_forward(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    """Make ``model.forward`` the ``torch.compile(backend=backend)`` version of it; '' leaves it alone.

    Args:
        model: the (not DDP-wrapped) model.
        backend: a ``torch.compile`` backend name ('inductor', 'aot_eager', 'eager'), or '' for none.
    Returns:
        ``model`` itself.
    """
    if not backend:
        return model
    eager = model.forward
    try:
        compiled = torch.compile(eager, backend=backend, dynamic=True)
    except Exception as e:  # noqa: BLE001 - any failure means: train without compiling
        _fall_back(model, backend, e)
        return model

    @functools.wraps(eager)
    def forward(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            _fall_back(model, backend, e)
            return eager(*args, **kwargs)

    model.forward = forward
    logger.info("TRAIN.COMPILE: the model's forward goes through torch.compile (backend %s); the first "
                "steps compile it", backend)
    return model


def _fall_back(model, backend, error):
    model.__dict__.pop("forward", None)  # the class's (eager) forward again
    root = getattr(error, "inner_exception", None) or error.__cause__ or error  # dynamo wraps the backend's error
    text = str(root).strip()
    cause = "{}: {}".format(type(root).__name__, text.splitlines()[0] if text else "")
    logger.warning("TRAIN.COMPILE: torch.compile (backend %s) failed, training continues in eager mode "
                   "(set TRAIN.COMPILE '' to skip the attempt); cause: %s", backend, cause)
