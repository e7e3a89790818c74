"""The Task protocol: what one task (VCR, VQA, pretraining, ...) adds to the shared engine.

A task is a folder holding only what differs from the others, and one :class:`Task` object
registered by name in :data:`TASKS`::

    class MyTask(Task):
        name = "mytask"
        models = Registry("model of mytask", [MyModel])      # MODULE -> class
        def defaults(self): ...                               # fresh CfgNode (common_defaults() + own keys)
        def inputs(self, cfg): ...                            # optional: files that must exist
        def build_metrics(self, cfg, for_training): ...
    TASK = register_task(MyTask())

The engine (:mod:`common.engine`) builds everything else from the config: loaders, optimizer,
scheduler, autocast context, loss scaler, hooks, resume. ``common/`` never names a task or
reads a task-only key; those go through the methods below.
"""
import importlib
import os
from typing import Callable, Dict, NamedTuple, Optional

import torch

from common.config import build_config
from common.config.handoff_folder import handoff_opts
from common.config.values import SHARED_RULES
from common.data.build import build_dataset
from common.errors import ExportRefused
from common.registry import Registry

# Renames applied to a pretraining state dict after the PARTIAL_PRETRAIN_PREFIX_CHANGES:
# (parsed, raw, source) -> parsed, where ``parsed`` holds the renamed fp32 tensors and ``raw`` the
# file's tensors under their own names (``module.`` removed); ``source`` names the file for errors.
PretrainRenames = Callable[[Dict[str, torch.Tensor], Dict[str, torch.Tensor], str], Dict[str, torch.Tensor]]


class Input(NamedTuple):
    """A folder or file a config names and a run needs: ``key`` (dotted config key), ``what`` (the words
    an error uses, "BERT folder"), ``path``, ``is_dir`` (a folder, else a file)."""
    key: str
    what: str
    path: str
    is_dir: bool = False

    def exists(self):
        """Whether ``path`` is on this machine (a folder or a file, as ``is_dir`` says)."""
        return os.path.isdir(self.path) if self.is_dir else os.path.isfile(self.path)


class Task:
    """Base class of a task plug-in; subclasses set ``name`` and ``models`` and define
    :meth:`defaults` and :meth:`build_metrics`.

    Attributes:
        name: registry name (``'vcr'``), also the task folder's name.
        models: :class:`common.registry.Registry` of the task's model classes (``MODULE``).
        host_metric_name: validation metric that picks the best epoch (higher is better).
        find_unused_parameters: the model may leave trainable params out of a step's graph
            (DDP must then look for them, which costs a graph traversal per synced micro-batch).
        value_rules: dotted key -> :class:`common.config.Rule`, the valid values checked when the
            config is read (:func:`common.config.task_rules` adds the task's keys to the shared ones).
        partial_pretrain_key: dotted config key that the ``--partial-pretrain`` flag sets; None: the task
            takes no such file, and the flag stops the run with an error.
        onnx_refusal: why ``tools/export.py --format onnx`` refuses the task (:meth:`onnx_export_refusal`);
            None for a task that defines :meth:`onnx_graph`.
    """
    name: str = ""
    models: Optional[Registry] = None
    host_metric_name: str = "Acc"
    find_unused_parameters: bool = False
    value_rules: dict = SHARED_RULES
    partial_pretrain_key: Optional[str] = None
    onnx_refusal: Optional[str] = "it declares no ONNX graph (Task.onnx_graph)"

    def defaults(self):
        """The task's config defaults as a fresh mutable ``CfgNode``."""
        raise NotImplementedError

    def load_config(self, path=None, opts=None):
        """A fresh frozen config: :meth:`defaults`, then the YAML at ``path`` (if any), then ``opts``. The
        ``config.yaml`` of a hand-off folder names the folder's copies
        (:func:`common.config.handoff_folder.handoff_opts`).

        Raises:
            common.config.ConfigError: bad file, key or value (names the file, line and key); a
                value outside :attr:`value_rules`.
        """
        return build_config(self.defaults, self.value_rules, path, handoff_opts(path) + list(opts or []))

    def inputs(self, cfg):
        """The folders and files the config names that training reads, as :class:`Input`; the engine checks
        that they exist before anything runs. Default: each data set's DATASET.DATASET_PATH (an entry of a
        DATASET list may name none: a text corpus names its files, and its reader checks them)."""
        datasets = cfg.DATASET if isinstance(cfg.DATASET, list) else [cfg.DATASET]
        return [Input("DATASET.DATASET_PATH", "data folder", d.DATASET_PATH, is_dir=True)
                for d in datasets if d.DATASET_PATH or len(datasets) == 1]

    def partial_pretrain(self, cfg):
        """``(file, prefix changes)`` of a pretraining checkpoint whose matching weights initialise the model
        (:func:`common.checkpoint.partial_pretrain.load_partial_pretrain`); None (default): none."""
        return None

    def build_dataset(self, cfg, mode):
        """Dataset of ``mode`` ('train', 'val', 'test'); default: the one registered under
        ``DATASET.DATASET`` (see :func:`common.data.build.register_dataset`)."""
        return build_dataset(cfg, mode)

    def train_batch_multiple(self, cfg):
        """``(m, reason)``: every training batch must hold a multiple of ``m`` samples (the model needs it,
        ``reason`` says why, naming the keys); the last batch of an epoch that does not is dropped, with one
        log line (:func:`common.data.build.make_dataloader`). Default ``(1, '')``: every batch is trained."""
        return 1, ""

    def build_model(self, cfg):
        """The model ``cfg.MODULE`` names: ``outputs, loss = model(*batch)`` in train mode,
        ``outputs = model(*batch)`` in eval mode (batch in ``dataset.data_names`` order).

        Raises:
            KeyError: ``MODULE`` is not one of ``self.models`` (the message lists them).
        """
        return self.models.build(cfg)

    def host_metric(self, cfg):
        """Name of the validation metric that picks the best epoch (higher is better); default
        ``host_metric_name``."""
        return self.host_metric_name

    def label_index_in_batch(self, cfg):
        """Position of the label in a validation batch (taken out and put into the outputs as ``label``);
        None: none, the model returns its labels. Default: ``DATASET.LABEL_INDEX_IN_BATCH`` (of the first
        entry of a ``DATASET`` list)."""
        dataset = cfg.DATASET[0] if isinstance(cfg.DATASET, list) else cfg.DATASET
        return dataset.LABEL_INDEX_IN_BATCH

    def build_metrics(self, cfg, for_training):
        """Metric object with ``reset()``, ``update(outputs)`` and ``get_name_value()``; while
        training it also reads the losses named by ``TRAIN.LOSS_LOGGERS``."""
        raise NotImplementedError

    def check_config(self, cfg, source="config"):
        """Warn about keys set without effect and stop on refused values (see
        :mod:`common.config.keys`); called first by the engine's entry points. Default: nothing.

        Raises:
            common.config.ConfigError: a value the task refuses (names the key).
        """

    def check_checkpoint(self, cfg, ckpt, source):
        """Stop before a checkpoint dict ``ckpt`` (read from the file ``source``) that the config's model cannot
        take for a reason its keys do not say clearly (resume, :meth:`partial_pretrain`, evaluation). Default:
        nothing.

        Raises:
            common.errors.UserInputError: the checkpoint does not suit the config (names the file).
        """

    def init_after_pretrain(self, cfg, model):
        """Last initialisation of a model built for training, after :meth:`partial_pretrain` is loaded
        (for weights derived from loaded ones); a resumed checkpoint then overwrites them. Default: nothing."""

    def pretrain_renames(self, cfg) -> Optional[PretrainRenames]:
        """Key renames used when fine-tuning from a pretraining checkpoint (:meth:`partial_pretrain`),
        after the generic prefix changes; None: no task-specific renames."""
        return None

    def test_evaluator(self, cfg, dataset, save_path, save_name):
        """The :class:`common.inference.evaluation.DatasetEvaluator` of the test split: its ``evaluate()`` writes the
        predictions on ``dataset`` in the task's result format, as a file under the folder ``save_path``
        whose name starts with ``save_name``, and returns the file's path.

        Raises:
            NotImplementedError: the task has no result writer.
        """
        raise NotImplementedError("task '{}' has no result writer".format(self.name))

    def run_info(self, cfg, dataset):
        """What a predictor of this run needs besides the config and the weights, from the training data set
        ``dataset`` (class names, an answer vocabulary): a JSON-able dict, written by training as
        ``predictor.json`` in the run folder (:func:`common.checkpoint.run_files.write_run_info`). Default: ``{}``."""
        return {}

    def predictor(self, cfg, ckpt, ckpt_path, device, feature_weights=None, box_source=None):
        """The task's :class:`common.inference.predictor.TaskPredictor` (``<task>/predict.py``) for the checkpoint dict
        ``ckpt`` read from the file ``ckpt_path`` (its run folder holds the :meth:`run_info`); see
        :meth:`common.inference.Predictor.from_checkpoint` for the other arguments.

        Raises:
            common.errors.UserInputError: the task has no predictor, or the run's files do not suit the config.
        """
        from common.errors import UserInputError
        raise UserInputError("task '{}' has no predictor".format(self.name))

    def onnx_export_refusal(self, cfg):
        """Why ``tools/export.py --format onnx`` refuses the config ``cfg`` (checked before anything loads), or
        None when :meth:`onnx_graph` exports it. Default: :attr:`onnx_refusal`."""
        return self.onnx_refusal

    def onnx_graph(self, cfg, model):
        """The :class:`common.inference.onnx_export.OnnxGraph` that ``tools/export.py`` writes for ``model`` (built from
        ``cfg``, weights loaded, eval mode).

        Raises:
            common.errors.ExportRefused: default, with :attr:`onnx_refusal`.
        """
        raise ExportRefused(self.name, self.onnx_refusal or "it declares no ONNX graph (Task.onnx_graph)")

    def model_title(self, cfg):
        """How pages and reports name the model of ``cfg`` (the web page's title): default ``"<task> model"``."""
        return "{} model".format(self.name)

    def handoff_files(self, cfg):
        """Files that a hand-off folder (:mod:`common.checkpoint.handoff`) copies besides the weights, ``config.yaml``
        and the run's predictor files, so that it is read without the training data: ``{file name: (dotted config key
        that names the file, text)}``; reading the folder points each key at its copy. Default: none."""
        return {}


TASKS = Registry("task", key="task", hint=" (import the task's package, e.g. vcr.task, to register it)")


def register_task(task):
    """Add the :class:`Task` instance ``task`` under ``task.name``; returns it.

    Raises:
        ValueError: ``task.name`` is empty or registered for another task.
    """
    if not task.name:
        raise ValueError("a Task needs a name, got {!r}".format(task.name))
    return TASKS.register(task, task.name)


def get_task(name):
    """The registered task ``name``, importing its package's ``<name>.task`` module first when it is not
    registered yet (a task registers itself there).

    Raises:
        KeyError: no such task, listing the known ones.
    """
    if name not in TASKS:
        try:
            importlib.import_module(name + ".task")
        except ImportError:
            pass  # not a task package: the registry's KeyError says which are known
    return TASKS.get(name)
