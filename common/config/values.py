"""The ranges of the numeric config keys, checked once right after the YAML and ``--opts`` merge.

The merge (:mod:`common.config.loader`) already gives every key its type (an int key holds an
int, a float key a float); a table of rules, dotted key -> :class:`Rule`, then says which values
are valid, so that ``TRAIN.GRAD_ACCUMULATE_STEPS: 0`` stops before a model or a loader is built
instead of as a ``ZeroDivisionError`` deep inside. :data:`SHARED_RULES` covers the keys of
:func:`common.config.common_defaults`; a group of keys has its rules next to the function that adds it
(:data:`common.modeling.vlbert_config.VLBERT_RULES`), and each task adds the rules of the keys its own
data set and model read with :func:`task_rules` (``common/`` never imports a task).
A ``DATASET`` list entry's keys use the ``DATASET.`` rules.

Only values that a config file or ``--opts`` set are checked (the defaults are ours: the default
``END_EPOCH`` 0 of a config that only evaluates is not an error). A rule that reads other keys
(``END_EPOCH`` > ``BEGIN_EPOCH``) is checked when any of them was set.
"""
from typing import Callable, NamedTuple, Tuple

TRACKERS = ('tensorboard', 'mlflow', 'wandb')  # REPORT_TO's names (common/trackers)


class Rule(NamedTuple):
    """What one key accepts.

    Attributes:
        ok: ``ok(value, get) -> bool``; ``get(dotted_key)`` reads another key (one of ``reads``).
        expected: ``expected(get) -> str``, the text after "expected" in the error ("an int >= 1").
        reads: the other dotted keys ``ok`` reads.
    """
    ok: Callable
    expected: Callable
    reads: Tuple[str, ...] = ()


def _int_or_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def int_at_least(low):
    """An int >= ``low`` (a list of such ints too: ``BATCH_IMAGES`` per data set)."""
    return Rule(lambda v, get: all(x >= low for x in _int_or_list(v)), lambda get: "an int >= {}".format(low))


def number_at_least(low):
    """A number >= ``low`` (each number of a list too)."""
    return Rule(lambda v, get: all(x >= low for x in _int_or_list(v)), lambda get: "a number >= {}".format(low))


def number_above(low):
    """A number > ``low`` (each number of a list too)."""
    return Rule(lambda v, get: all(x > low for x in _int_or_list(v)), lambda get: "a number > {}".format(low))


def number_in(low, high):
    """A number in [low, high]."""
    return Rule(lambda v, get: low <= v <= high, lambda get: "a number in [{}, {}]".format(low, high))


def one_of(*choices):
    """One of ``choices``."""
    return Rule(lambda v, get: v in choices, lambda get: "one of {}".format(", ".join(map(str, choices))))


PROBABILITY = number_in(0, 1)

SHARED_RULES = {
    # numpy takes seeds (RNG_SEED + rank) below 2**32
    "RNG_SEED": Rule(lambda v, get: v < 2 ** 31, lambda get: "an int < 2**31 (negative: unseeded)"),
    "LOG_FREQUENT": int_at_least(1),
    "REPORT_TO": Rule(lambda v, get: len(set(v)) == len(v) and set(v) <= set(TRACKERS),
                      lambda get: "a list of distinct names out of {}".format(", ".join(TRACKERS))),
    "DIST_TIMEOUT_S": int_at_least(1),
    "VAL_FREQUENT": int_at_least(1),
    "CHECKPOINT_FREQUENT": int_at_least(1),
    "NUM_WORKERS_PER_GPU": int_at_least(0),
    "SCALES": int_at_least(1),

    "NETWORK.PIXEL_STDS": number_above(0),

    "TRAIN.FLIP_PROB": PROBABILITY,
    "TRAIN.BATCH_IMAGES": int_at_least(1),
    "TRAIN.BEGIN_EPOCH": int_at_least(0),
    "TRAIN.END_EPOCH": Rule(lambda v, get: v > get("TRAIN.BEGIN_EPOCH"),
                            lambda get: "an int > TRAIN.BEGIN_EPOCH ({})".format(get("TRAIN.BEGIN_EPOCH")),
                            ("TRAIN.BEGIN_EPOCH",)),
    "TRAIN.GRAD_ACCUMULATE_STEPS": int_at_least(1),
    # 0 is valid: the weights stay as built (the tests record a run's initial weights that way).
    "TRAIN.LR": number_at_least(0),
    "TRAIN.LR_FACTOR": number_above(0),
    "TRAIN.LR_STEP": number_at_least(0),
    # (a negative LR is TRAIN.LR's error alone)
    "TRAIN.LR_MIN": Rule(lambda v, get: 0 <= v <= max(get("TRAIN.LR"), 0),
                         lambda get: "a number in [0, TRAIN.LR ({})]".format(get("TRAIN.LR")), ("TRAIN.LR",)),
    "TRAIN.LABEL_SMOOTHING": PROBABILITY,
    "TRAIN.OPTIM_STATE_DTYPE": one_of("float32", "bfloat16"),
    "TRAIN.STRATEGY": one_of("ddp", "fsdp"),
    "TRAIN.WARMUP_FACTOR": number_in(0, 1),
    "TRAIN.WARMUP_STEPS": int_at_least(0),
    "TRAIN.WD": number_at_least(0),
    "TRAIN.MOMENTUM": number_in(0, 1),
    "TRAIN.FP16_LOSS_SCALE": Rule(lambda v, get: v == "dynamic" or v > 0, lambda get: "'dynamic' or a number > 0"),
    "TRAIN.MAX_CONSECUTIVE_SKIPS": int_at_least(1),
    "TRAIN.PROFILE": Rule(lambda v, get: len(v) == 0 or len(v) == 2 and all(isinstance(x, int) and x >= 1 for x in v),
                          lambda get: "[] (off) or [START_STEP, NUM_STEPS], two ints >= 1"),
    "TRAIN.CHECKPOINT_STEPS": int_at_least(0),
    "TRAIN.CHECKPOINT_KEEP": int_at_least(1),
    "TRAIN.CHECKPOINT_EVERY_FRACTION": number_in(0, 1),
    "TRAIN.EMA_DECAY": Rule(lambda v, get: 0 <= v < 1, lambda get: "0 (off) or a number in (0, 1)"),
    "TRAIN.EARLY_STOP_MODE": one_of("min", "max"),
    "TRAIN.EARLY_STOP_PATIENCE": int_at_least(1),

    "VAL.FLIP_PROB": PROBABILITY,
    "VAL.BATCH_IMAGES": int_at_least(1),
    "TEST.FLIP_PROB": PROBABILITY,
    "TEST.BATCH_IMAGES": int_at_least(1),
}


def task_rules(own, shared=()):
    """A task's rule table: :data:`SHARED_RULES`, then the tables ``shared`` of the key groups its defaults
    add (e.g. :data:`common.modeling.vlbert_config.VLBERT_RULES`), then ``own`` (dotted key ->
    :class:`Rule`) for the keys its data set and model read and its own keys; a later entry replaces an
    earlier one."""
    rules = dict(SHARED_RULES)
    for group in shared:
        rules.update(group)
    rules.update(own)
    return rules


def _leaves(node, prefix=""):
    """(dotted name, rule key, value) of each leaf; a DATASET list entry's ``DATASET[i].X`` has rule key ``DATASET.X``."""
    for k, v in node.items():
        if isinstance(v, dict):
            yield from _leaves(v, prefix + k + ".")
        elif k == "DATASET" and isinstance(v, list):
            for i, entry in enumerate(v):
                for name, _, value in _leaves(entry):
                    yield "{}DATASET[{}].{}".format(prefix, i, name), "DATASET." + name, value
        else:
            yield prefix + k, prefix + k, v


def _get(cfg, key, entry=None):
    """The value of dotted ``key``; ``DATASET.X`` of a DATASET list is read from its entry ``entry``."""
    if entry is not None and key.startswith("DATASET."):
        cfg, key = cfg.DATASET[entry], key[len("DATASET."):]
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def _entry(name):
    """``1`` for ``DATASET[1].X`` (a DATASET list entry's leaf), None otherwise."""
    return int(name[len("DATASET["):name.index("]")]) if name.startswith("DATASET[") else None


def _name_in_entry(key, entry):
    """The leaf name of dotted ``key`` as :func:`_leaves` gives it, within DATASET entry ``entry``."""
    if entry is not None and key.startswith("DATASET."):
        return "DATASET[{}].{}".format(entry, key[len("DATASET."):])
    return key


def value_errors(cfg, rules, sources):
    """The values of ``cfg`` that break their rule, among those a file or ``--opts`` set.

    Args:
        cfg (CfgNode): the merged config.
        rules (dict): dotted key -> :class:`Rule` (:func:`task_rules`); keys ``cfg`` lacks are skipped.
        sources (dict): dotted name (``DATASET[0].X`` in a list) -> where it was set ("file:line",
            "--opts"); names not in it hold their default and are not checked.
    Returns:
        list of str, one per bad value: ``<where>: <key>: expected <range>, got <value>``, in
        the order of ``cfg``'s keys; empty when every value is valid.
    """
    errors = []
    for name, rule_key, value in _leaves(cfg):
        rule = rules.get(rule_key)
        if rule is None:
            continue
        entry = _entry(name)
        where = [sources[k] for k in (name,) + tuple(_name_in_entry(r, entry) for r in rule.reads) if k in sources]
        if not where:
            continue
        get = lambda key: _get(cfg, key, entry)  # noqa: E731
        if not rule.ok(value, get):
            errors.append("{}: {}: expected {}, got {!r}".format(where[0], name, rule.expected(get), value))
    return errors
