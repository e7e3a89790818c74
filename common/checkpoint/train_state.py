"""The training loop's progress as a plain dict: what a checkpoint stores under ``train_state``.

Keys (all counts start at 0):

* ``epoch``: the epoch being trained, or the next one once an epoch is done;
* ``epoch_batch``: micro-batches of ``epoch`` already consumed (a resume skips them);
* ``global_step``: applied optimizer steps over the whole run (skipped steps not counted);
* ``skipped_steps``: optimizer steps skipped for inf/nan gradients;
* ``consecutive_skips``: skipped steps since the last applied one (divergence guard);
* ``last_finite_loss``: the last finite accumulation-group loss (nan before the first);
* ``last_finite_step``: the tried optimizer step (applied + skipped, from 1) of that loss (0 before the first);
* ``epoch_units``: units of the epoch's global order trained so far
  (:meth:`common.data.samplers.ResumableBatchSampler.consumed`, the same on every rank; 0 when the
  loader does not count them, e.g. the multi-task loader);
* ``world_size``: processes of the run that wrote the state (0: unknown, a checkpoint older than the key).

A resume on another number of processes restarts the epoch after ``epoch_units`` re-sharded over the new
ranks; a state without the last two keys (older checkpoints) resumes by ``epoch_batch`` on the same layout.
"""
import math

DEFAULTS = {"epoch": 0, "epoch_batch": 0, "global_step": 0, "skipped_steps": 0, "consecutive_skips": 0,
            "last_finite_loss": math.nan, "last_finite_step": 0, "epoch_units": 0, "world_size": 0}
# Keys that checkpoints written before them lack: their default (0 = unknown) stands in.
ADDED_LATER = ("last_finite_step", "epoch_units", "world_size")


def new_train_state(**values) -> dict:
    """A fresh state dict, ``values`` overriding the defaults.

    Raises:
        KeyError: a name that is not a state key.
    """
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise KeyError("unknown train state keys {} (known: {})".format(unknown, sorted(DEFAULTS)))
    state = dict(DEFAULTS)
    state.update(values)
    return check_train_state(state)


def check_train_state(state: dict) -> dict:
    """A copy of ``state`` with every value cast to its key's type (int or float); the keys of
    :data:`ADDED_LATER` may be missing (older checkpoints) and get their defaults.

    Raises:
        KeyError: another key is missing (names it and the keys present).
    """
    for key in DEFAULTS:
        if key not in state and key not in ADDED_LATER:
            raise KeyError("train state misses {!r} (has {})".format(key, sorted(state)))
    return {key: type(default)(state.get(key, default)) for key, default in DEFAULTS.items()}


def tried_steps(state: dict) -> int:
    """Optimizer steps tried over the whole run (applied or skipped): what step-periodic work counts."""
    return state["global_step"] + state["skipped_steps"]
