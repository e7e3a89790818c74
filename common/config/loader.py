"""Configuration loading: the checked YAML / ``--opts`` merge, YAML output, a task's config.

Life cycle of a config (in this module only; the idea of detectron2 ``config/config.py``)::

    task defaults (copy) -> legacy conversion (common/config/compat.py) -> checked YAML merge
        -> checked --opts merge -> value ranges (common/config/values.py) -> freeze
        -> written as YAML into the output folder

The shared defaults are in :mod:`common.config.defaults`. Each task's ``<task>/function/config.py``
adds its own keys to ``common_defaults()``; its ``Task.load_config(path, opts)`` (:func:`build_config`)
is the one way to load a config.

Bad input raises :class:`ConfigError` whose message names the file (and line), the dotted key,
what was expected and, for an unknown key, the closest valid key; values out of range raise it
with one line per bad value.
"""
import copy
import difflib

import yaml
from yacs.config import CfgNode

from common.config.compat import CONVERTERS, to_float, to_int
from common.config.values import SHARED_RULES, value_errors
from common.errors import UserInputError
from common.fileio.safe_write import atomic_write


class ConfigError(UserInputError):
    """A config file, a key or a value is wrong; the message says where and what was expected."""


class ConfigValueError(ConfigError):
    """Values out of range: ``lines`` holds one message per bad value (``str()`` joins them)."""

    def __init__(self, lines):
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def _key_lines(node, prefix=""):
    """Map dotted keys of a composed YAML mapping node to their 1-based line numbers."""
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = prefix + str(key_node.value)
            lines[key] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, key + "."))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_key_lines(item, "{}[{}].".format(prefix.rstrip("."), i)))
    return lines


def read_yaml(path):
    """Read a config YAML file with the safe loader.

    Returns:
        (dict, dict): the mapping and the 1-based line of each dotted key.
    Raises:
        ConfigError: the file is missing or unreadable, is not valid YAML (the message gives the
            line and column), or does not hold a mapping.
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("{}: cannot read config file: {}".format(path, e.strerror or e)) from None
    try:
        data = yaml.safe_load(text)
        lines = _key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = "{}:{}:{}".format(path, mark.line + 1, mark.column + 1) if mark else path
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError("{}: invalid YAML: {}".format(where, problem)) from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError("{}: expected a mapping of config keys at the top level, got {}".format(
            path, type(data).__name__))
    return data, lines


# --------------------------------------------------------------------------------------------- #
# Checked merge
# --------------------------------------------------------------------------------------------- #
def _where(source, lines, key):
    line = lines.get(key)
    return "{}:{}".format(source, line) if line else source


def _all_keys(node, prefix=""):
    for k, v in node.items():
        yield prefix + k
        if isinstance(v, CfgNode):
            yield from _all_keys(v, prefix + k + ".")


def _unknown_key(root, root_prefix, source, lines, key):
    """The ConfigError of an unknown ``key``, with the closest valid key: a near name in the same section
    (case ignored), else the same name in another section. The key's own sections are never offered
    (``DATASET.NOPE`` is no typo of ``DATASET``)."""
    parent, _, name = key.rpartition(".")
    candidates = [c for c in _all_keys(root, root_prefix) if not key.startswith(c + ".")]
    siblings = {c.rpartition(".")[2].upper(): c for c in candidates if c.rpartition(".")[0] == parent}
    match = difflib.get_close_matches(name.upper(), list(siblings), n=1, cutoff=0.6)
    suggestion = siblings[match[0]] if match else next(
        (c for c in candidates if c.rpartition(".")[2].upper() == name.upper()), None)
    hint = "; did you mean {}?".format(suggestion) if suggestion else ""
    return ConfigError("{}: {}: no such key{}".format(_where(source, lines, key), key, hint))


def _type_name(t):
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", tuple: "list"}.get(
        t, t.__name__)


def _coerce(default, value, key):
    """Check ``value`` against the type of ``default``; return the typed value or raise ValueError."""
    if key.startswith("DATASET["):  # entries of a DATASET list share the DATASET rules
        key = "DATASET." + key.split("].", 1)[1]
    convert = CONVERTERS.get(key)
    if convert is not None:
        return convert(value)
    expected = type(default)
    if expected is float:
        return to_float(value)
    if expected is int:
        return to_int(value)
    if expected is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # lossless: `GPUS: 0` is the id string "0"
    if expected in (list, tuple) and isinstance(value, (list, tuple)):
        return expected(value)
    if expected in (bool, str) and type(value) is expected:
        return value
    raise ValueError("expected {}, got {} {!r}".format(_type_name(expected), type(value).__name__, value))


def _merge(node, raw, root, root_prefix, source, lines, prefix, sources):
    """Merge the plain mapping ``raw`` into CfgNode ``node`` in place, checking keys and types.

    ``root`` (whose keys are named ``root_prefix`` + key) is searched for the closest valid key;
    ``sources`` gets dotted key -> where (file:line or '--opts') of each value set.
    """
    for k, v in raw.items():
        key = prefix + str(k)
        if k not in node:
            raise _unknown_key(root, root_prefix, source, lines, key)
        current = node[k]
        if isinstance(current, CfgNode):
            if not isinstance(v, dict):
                raise ConfigError("{}: {}: expected a mapping of keys, got {!r}".format(
                    _where(source, lines, key), key, v))
            _merge(current, v, root, root_prefix, source, lines, key + ".", sources)
        elif isinstance(current, list) and current and isinstance(current[0], CfgNode):
            # DATASET already a list (merged before): entries are matched by position.
            raise ConfigError("{}: {}: cannot merge into a list of data sets; set the whole list".format(
                _where(source, lines, key), key))
        else:
            try:
                node[k] = _coerce(current, v, key)
            except ValueError as e:
                raise ConfigError("{}: {}: {}".format(_where(source, lines, key), key, e)) from None
            sources[key] = _where(source, lines, key)


_DATASET_DEFAULTS = "_dataset_defaults"


def _merge_dataset_list(cfg, entries, source, lines, sources):
    """``DATASET: [ {...}, {...} ]``: one CfgNode per entry, each completed with the task defaults.

    A list given again (a second file, or ``--opts DATASET "[...]"``) replaces the whole list; its
    entries are completed from the task defaults too, not from the entries they replace.
    """
    if isinstance(cfg.DATASET, CfgNode):
        # Kept outside the keys (in __dict__, which deepcopy carries) for a later list to start from.
        cfg.__dict__[_DATASET_DEFAULTS] = copy.deepcopy(cfg.DATASET)
    template = cfg.__dict__[_DATASET_DEFAULTS]
    for key in [k for k in sources if k.startswith("DATASET[")]:  # values of the list replaced
        del sources[key]
    datasets = []
    for i, entry in enumerate(entries):
        key = "DATASET[{}]".format(i)
        if not isinstance(entry, dict):
            raise ConfigError("{}: {}: expected a mapping of DATASET keys, got {!r}".format(
                _where(source, lines, key), key, entry))
        node = copy.deepcopy(template)
        _merge(node, entry, node, key + ".", source, lines, key + ".", sources)
        datasets.append(node)
    if not datasets:
        raise ConfigError("{}: DATASET: expected a mapping or a non-empty list of mappings".format(source))
    cfg.DATASET = datasets


def merge_dict(cfg, raw, source, lines=None, sources=None):
    """Merge a plain mapping (e.g. from YAML) into ``cfg`` in place, with legacy conversions.

    Args:
        cfg (CfgNode): mutable config holding every valid key.
        raw (dict): values to merge; nested mappings for sections.
        source (str): file name (or '--opts') quoted in errors.
        lines (dict): optional dotted key -> line number, quoted in errors.
        sources (dict): optional; gets dotted key (``DATASET[i].X`` in a list) -> where its value
            was set (``file:line``, or ``source``), for :func:`check_values`.
    Raises:
        ConfigError: unknown key (with the closest valid key) or a value of the wrong type.
    """
    lines = lines or {}
    sources = {} if sources is None else sources
    raw = dict(raw)
    datasets = raw.pop("DATASET", None)
    if isinstance(datasets, list):
        _merge_dataset_list(cfg, datasets, source, lines, sources)
    elif datasets is not None:
        raw["DATASET"] = datasets
    _merge(cfg, raw, cfg, "", source, lines, "", sources)


def merge_file(cfg, path, sources=None):
    """Merge the YAML file at ``path`` into ``cfg`` in place (see :func:`merge_dict`)."""
    raw, lines = read_yaml(path)
    merge_dict(cfg, raw, path, lines, sources)


def merge_opts(cfg, opts, sources=None):
    """Merge command-line overrides ``[KEY, VALUE, KEY, VALUE, ...]`` (detectron2 style).

    Values are parsed as YAML (``--opts TRAIN.LR 1e-4 TRAIN.LR_STEP "[3, 5]"``) and checked like
    file values (``sources``: see :func:`merge_dict`). Raises ConfigError on an odd number of
    items, an unknown key or a bad value.
    """
    opts = list(opts or [])
    if len(opts) % 2:
        raise ConfigError("--opts: expected KEY VALUE pairs, got an odd number of items: {}".format(opts))
    for key, text in zip(opts[0::2], opts[1::2]):
        try:
            value = yaml.safe_load(text) if isinstance(text, str) else text
        except yaml.YAMLError:  # not YAML: take the text as it is
            value = text
        if value is None and text == "":
            value = ""
        nested = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        merge_dict(cfg, nested, "--opts", sources=sources)


def check_values(cfg, rules, sources):
    """Check the ranges of the values a file or ``--opts`` set (see :mod:`common.config.values`).

    Args:
        cfg (CfgNode): the merged config; rules (dict): dotted key -> Rule; sources (dict): from the merges.
    Raises:
        ConfigValueError: one line per bad value, ``<file>:<line>: <key>: expected <range>, got <value>``
            (``--opts`` for a value given there).
    """
    errors = value_errors(cfg, rules, sources)
    if errors:
        raise ConfigValueError(errors)


def freeze_all(cfg):
    """Freeze ``cfg`` including data sets held in a list (yacs only freezes nested CfgNodes)."""
    cfg.freeze()
    if isinstance(cfg.get("DATASET"), list):
        for node in cfg.DATASET:
            node.freeze()
    return cfg


# --------------------------------------------------------------------------------------------- #
# Writing YAML
# --------------------------------------------------------------------------------------------- #
def to_plain(value):
    """A CfgNode (or any nested value) as plain dicts and lists, ready for ``yaml.safe_dump``."""
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def dump_config(cfg, path):
    """Write the effective config as YAML to ``path`` atomically; loading it gives the same config.

    Raises:
        common.fileio.safe_write.OutputWriteError: disk full or folder not writable (names the folder).
    """
    text = yaml.safe_dump(to_plain(cfg), default_flow_style=False, sort_keys=False)
    atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text))


# --------------------------------------------------------------------------------------------- #
# Building a task's config
# --------------------------------------------------------------------------------------------- #
def build_config(defaults_fn, rules, path=None, opts=None):
    """A fresh frozen config: ``defaults_fn()``, then the YAML at ``path`` (if any), then ``opts``, each
    value set checked against ``rules`` (dotted key -> :class:`common.config.values.Rule`). The one
    loader of every entry point, through :meth:`common.task.Task.load_config`.

    Raises:
        ConfigError: see :func:`read_yaml`, :func:`merge_dict`, :func:`merge_opts`, :func:`check_values`.
    """
    cfg = defaults_fn()
    sources = {}
    if path is not None:
        merge_file(cfg, path, sources)
    merge_opts(cfg, opts, sources)
    check_values(cfg, rules, sources)
    return freeze_all(cfg)


def reference_api(defaults_fn, rules):
    """``(config, update_config)`` of the reference release's ``<task>/function/config.py``, kept for
    scripts written against it: ``config`` is a mutable CfgNode of the task defaults and
    ``update_config(path)`` merges a file into it in place, checked like :func:`build_config`
    (ConfigError on a bad file, key or value). Loading a config for a run goes through the Task."""
    config = defaults_fn()

    def update_config(config_file):
        sources = {}
        merge_file(config, config_file, sources)
        check_values(config, rules, sources)

    return config, update_config
