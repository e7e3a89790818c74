"""Which registered task a config or a checkpoint belongs to (by the data set it names)."""
import yaml

from common.errors import UserInputError
from common.task import TASKS


def config_dataset(node):
    """The ``DATASET.DATASET`` name of a config read as a plain dict (of a DATASET list: the first entry's); None
    when it names none."""
    dataset = (node or {}).get("DATASET")
    if isinstance(dataset, list):
        dataset = dataset[0] if dataset else None
    return dataset.get("DATASET") if isinstance(dataset, dict) else None


def find_task(dataset_name, source):
    """The registered task whose folder defines the data set ``dataset_name`` (``DATASET.DATASET``).

    Raises:
        UserInputError: no registered task owns it (names ``source`` and the registered tasks).
    """
    from common.data.build import DATASETS  # the registry of every imported task's data sets
    try:
        owner = DATASETS.get(dataset_name).__module__.split(".")[0]
    except KeyError:
        owner = None
    if owner in TASKS:
        return TASKS.get(owner)
    raise UserInputError("{}: DATASET.DATASET {!r} is none of the tasks' data sets ({}); give the task "
                         "(task=..., --task)".format(source, dataset_name, ", ".join(sorted(TASKS))))


def read_yaml(path, what):
    """The YAML file ``path`` as a dict (``{}`` when empty).

    Raises:
        UserInputError: a missing or unreadable file (names ``what`` and the path).
    """
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise UserInputError("{} '{}' does not exist".format(what, path)) from None
    except (OSError, yaml.YAMLError) as e:
        raise UserInputError("{} '{}' is not readable YAML: {}".format(what, path, e)) from None


def check_same_task(task, cfg, ckpt, ckpt_path, cfg_path):
    """UserInputError when the checkpoint's own config (saved in it at training time) is of another task or
    MODULE than ``cfg``."""
    text = ckpt.get("config")
    if not isinstance(text, str):
        return
    try:
        saved = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return
    dataset = config_dataset(saved)
    try:
        other = find_task(dataset, ckpt_path) if dataset else None
    except UserInputError:
        other = None
    if other is not None and other is not task:
        raise UserInputError("{} is a checkpoint of task '{}' (DATASET.DATASET {!r}), but the config {} is of task "
                             "'{}'; give the config it was trained with".format(
                                 ckpt_path, other.name, dataset, cfg_path, task.name))
    if saved.get("MODULE") and saved["MODULE"] != cfg.MODULE:
        raise UserInputError("{} was trained as MODULE {}, but the config {} builds MODULE {}".format(
            ckpt_path, saved["MODULE"], cfg_path, cfg.MODULE))
