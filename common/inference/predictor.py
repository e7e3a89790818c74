"""Use a trained model on raw inputs: ``Predictor.from_checkpoint(cfg, ckpt)(inputs)`` for every task.

    from common.inference import Predictor
    predictor = Predictor.from_checkpoint("cfgs/vqa/demo_cpu.yaml", "output/.../vl-bert_demo_vqa-best.model")
    predictor({"image": "photo.jpg", "question": "what colour is the ball ?"})
    # [{"image": "photo.jpg", "question": "...", "predictions": [{"label": "red", "index": 3, "score": 0.91}, ...],
    #   "boxes": [[x1, y1, x2, y2], ...]}]

The shape follows detectron2's ``DefaultPredictor`` (config -> model -> checkpoint -> the test transform ->
``__call__``) and timm's ``inference.py`` (top-k per input): the model is the one ``val.py`` / ``test.py``
load (:func:`common.engine.load_for_inference`: weights-only, eval mode), the inputs become the task data
set's tensors through the data set's own item code, the batch is collated by the data loader's collator (the
fixed SCALES canvas, the pad values) and run through the one inference loop
(:func:`common.inference.evaluation.inference_on_dataset`, fp32), so a prediction equals what ``test.py`` computes for
the same item.

Each task supplies a :class:`TaskPredictor` from its own folder (``<task>/predict.py``, returned by
:meth:`common.task.Task.predictor`); this module names no task. An input is a dict: ``image`` (a path, a
``PIL.Image`` or a numpy ``H x W x 3`` uint8 array) and the task's text fields (:attr:`TaskPredictor.fields`);
an output is the input's JSON-able fields plus ``predictions``, a list, best first, of
``{"label": str, "index": int, "score": float}`` (and the task's extra keys).

The predictor reads the files next to the checkpoint (its run folder, :mod:`common.checkpoint.run_files`): the
class names or answers (``predictor.json``) and how precomputed region features were made
(``feature_extractor.json``; ``feature_weights=`` overrides its weights).
"""
import contextlib
import os
import warnings

import torch

from common.checkpoint.checkpointer import load_checkpoint_file, load_model_state_dict
from common.checkpoint.features import DEFAULT_GRID, feature_config, feature_record
from common.checkpoint.handoff import handoff_config, handoff_task_name, read_handoff
from common.checkpoint.sharded import is_sharded_checkpoint
from common.config import ConfigError
from common.config.handoff_folder import CONFIG_FILE, is_handoff
from common.data.box_sources import BoxSource
from common.data.collate import BatchCollator, canvas_scales
from common.errors import CheckpointError, UserInputError
from common.inference.evaluation import DatasetEvaluator, inference_on_dataset
from common.inference.inputs import load_input_image
from common.inference.task_lookup import check_same_task, config_dataset, find_task, read_yaml
from common.modeling.module import checkpoint_sets_weights, held_random_init_warnings
from common.modeling.region_extractor import build_region_extractor
from common.modeling.visual_linguistic_bert import TextTooLongError
from common.task import get_task

__all__ = ["Predictor", "TaskPredictor", "load_feature_extractor", "recorded_box_source"]


def load_feature_extractor(task, cfg, ckpt_path, feature_weights, device):
    """``(encoder, transform, box source record)`` of a precomputed-feature model: the run folder's
    ``feature_extractor.json`` (:func:`feature_record`: ``cfg`` and ``opts`` of ``tools/extract_features.py``, its
    ``weights``, the ``box_source`` arguments), ``feature_weights`` overriding its weights.

    Raises:
        UserInputError: no weights known (names ``--feature-weights`` / ``feature_weights=``), an unreadable
            recorded config (names the record).
    """
    info = feature_record(ckpt_path)
    weights = feature_weights or info.get("weights")
    if not weights:
        raise UserInputError("{}: the model reads precomputed region features (NETWORK.IMAGE_FEAT_PRECOMPUTED), so a "
                             "photo needs the image encoder that made them: give --feature-weights FILE "
                             "(feature_weights=; the --weights file of tools/extract_features.py)".format(ckpt_path))
    model, transform = build_region_extractor(feature_config(task, cfg, info), weights, device,
                                              setting="--feature-weights")
    return model, transform, info.get("box_source")


def recorded_box_source(record, device):
    """The :class:`BoxSource` of a run's recorded ``box_source`` arguments
    (:data:`common.checkpoint.run_files.FEATURE_INFO`). A recorded 'file' source lists the training photos only:
    the photos it does not list get its ``fallback`` (a :data:`DEFAULT_GRID` grid when the record names none),
    with one warning."""
    record = dict(record)
    if record.get("kind") == "file":
        record.setdefault("fallback", {"kind": "grid", "grid": DEFAULT_GRID})
    return BoxSource(device=device, **record)


class TaskPredictor:
    """What one task adds to :class:`Predictor`: raw input -> data set item, model outputs -> predictions.

    Subclasses (``<task>/predict.py``) set :attr:`fields` and :attr:`dataset_class` and define :meth:`item`
    and :meth:`decode`; :meth:`forward` runs the model on a batch.

    Attributes:
        fields: ``{key: required}`` of the input's keys besides ``image`` (text fields, ``boxes``).
        dataset_class: the task's data set class (its ``pad_values`` and ``batch_extras`` collate the batch).
        label_field: the name of a label field the items carry (a placeholder, taken out before the forward).
        box_source: the :class:`common.data.box_sources.BoxSource` of images given without boxes (default: a
            :data:`DEFAULT_GRID` grid).
    """
    fields = {}
    dataset_class = None
    label_field = None

    def __init__(self, cfg, device, box_source=None):
        self.cfg = cfg
        self.device = device
        self.box_source = box_source if box_source is not None else BoxSource("grid", DEFAULT_GRID)

    @property
    def data_names(self):
        """The item's field names, in the model's order."""
        raise NotImplementedError

    def check_input(self, inputs, where):
        """Raise UserInputError (names ``where``) when a required field of :attr:`fields` is missing, empty or
        not text, or a key is unknown."""
        unknown = sorted(set(inputs) - set(self.fields) - {"image"})
        if unknown:
            raise UserInputError("{}: unknown key(s) {}; this task takes image, {}".format(
                where, unknown, ", ".join(self.fields)))
        for key, required in self.fields.items():
            value = inputs.get(key)
            if value is None:
                if required:
                    raise UserInputError("{}: '{}' is missing (this task needs {})".format(
                        where, key, ", ".join(k for k, r in self.fields.items() if r)))
                continue
            if key == "boxes":
                continue
            texts = value if isinstance(value, (list, tuple)) else [value]
            if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
                raise UserInputError("{}: '{}' must be non-empty text, got {!r}".format(where, key, value))

    def boxes_of(self, inputs, image, name):
        """float32 ``[K, 4]`` boxes of the input: its ``boxes`` (pixels of the image), else the box source's.

        Raises:
            UserInputError: ``boxes`` that are not ``[[x1, y1, x2, y2], ...]``; the box source's errors.
        """
        if inputs.get("boxes") is None:
            return self.box_source(image, name)
        try:
            boxes = torch.tensor(inputs["boxes"], dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            boxes = None
        if boxes is not None and boxes.numel() == 0:
            return boxes.reshape(0, 4)
        if boxes is None or boxes.dim() != 2 or boxes.shape[1] != 4:
            raise UserInputError("{}: 'boxes' must be a list of [x1, y1, x2, y2] rows in pixels, got {!r}".format(
                name, inputs["boxes"]))
        return boxes

    def item(self, image, inputs, index, name):
        """``(item, context)``: the data set's tuple (``data_names`` order) for one input and what
        :meth:`decode` needs of it (JSON-able dict merged into the output, keys starting with ``_`` dropped).

        Args:
            image: RGB ``PIL.Image``. inputs: the input dict. index: its position in the call.
            name: how errors name the input.
        """
        raise NotImplementedError

    def forward(self, model, inputs):
        """The model's outputs on a batch (less the label): ``model(*inputs)``."""
        return model(*inputs)

    def decode(self, outputs, contexts, topk):
        """One output dict per input from the batch's ``outputs`` (tensors on the CPU, batch first) and the
        inputs' contexts; each has ``predictions`` (see the module docstring)."""
        raise NotImplementedError


class _Collect(DatasetEvaluator):
    """Evaluator of the predictor's one batch: the task's forward, the outputs kept on the CPU."""

    def __init__(self, task_predictor):
        self.task_predictor = task_predictor

    def reset(self):
        self.outputs = []

    def forward(self, model, inputs):
        return self.task_predictor.forward(model, inputs)

    def process(self, inputs, outputs):
        self.outputs.append({k: v.detach().cpu() for k, v in outputs.items() if isinstance(v, torch.Tensor)})

    def evaluate(self):
        return self.outputs[0]


class Predictor:
    """A trained model of any task, used on raw inputs (see the module docstring).

    Attributes:
        task: the :class:`common.task.Task`. cfg: its frozen config. model: the model, eval mode, fp32.
        device: torch device. task_predictor: the task's :class:`TaskPredictor` (preprocessing, decoding).
        collator: the :class:`common.data.collate.BatchCollator` of the task's test loader.
    """

    def __init__(self, task, cfg, model, task_predictor, device):
        self.task, self.cfg, self.model, self.task_predictor = task, cfg, model, task_predictor
        self.device = torch.device(device)
        dataset = task_predictor.dataset_class
        item_cfg = _first_dataset_cfg(cfg) if isinstance(cfg.DATASET, list) else cfg  # the image-text data set
        self.collator = BatchCollator(task_predictor.data_names, pad_values=getattr(dataset, "pad_values", None),
                                      append_ind=item_cfg.DATASET.APPEND_INDEX, scales=canvas_scales(item_cfg),
                                      extras=getattr(dataset, "batch_extras", None))

    @classmethod
    def from_checkpoint(cls, cfg_path, ckpt_path=None, device="cpu", opts=(), feature_weights=None, box_source=None,
                        task=None, cli=False):
        """Load the model of ``ckpt_path`` as the config ``cfg_path`` (and ``opts``) describes it.

        Args:
            cfg_path: the YAML config the model was trained with (or the run folder's ``config.yaml``); None with a
                hand-off folder: its ``config.yaml``, its copied files in the place of those the config names. A
                hand-off folder alone (``Predictor.from_checkpoint(DIR)``) is read as ``(None, DIR)``.
            ckpt_path: a checkpoint file (``*-best.model``, ``*-0000.model``) or a hand-off folder
                (``tools/export.py --format safetensors``, :mod:`common.checkpoint.handoff`).
            device: torch device string.
            opts: config overrides ``[KEY, VALUE, ...]``.
            feature_weights: the image encoder weights that made the precomputed region features the model
                was trained on (``tools/extract_features.py --weights``); default: the run folder's
                :data:`common.checkpoint.run_files.FEATURE_INFO`.
            box_source: :class:`common.data.box_sources.BoxSource` or a dict of its arguments (``{"kind":
                "grid", "grid": "4x4"}``) for inputs without boxes; default: the run folder's record
                (:data:`common.checkpoint.run_files.FEATURE_INFO`), else a :data:`DEFAULT_GRID` grid.
            task: a task name or :class:`common.task.Task`; default: a hand-off folder's recorded task, else the
                task whose data set the config names (its ``<task>.task`` module must be imported;
                ``tools/predict.py`` imports them all). A task named is imported when needed.
            cli: the box source's messages name the command line's flags (``--box-source``), not ``box_source=``.
        Raises:
            UserInputError: a missing or unreadable file, a bad config, a checkpoint of another task or
                model, an answer vocabulary or class list that does not match the checkpoint, a
                precomputed-feature model without its feature extractor (names the flag to give).
        """
        if ckpt_path is None:
            if cfg_path is None or not is_handoff(cfg_path):
                raise UserInputError("give a checkpoint and its config, or a hand-off folder alone; {} is not a "
                                     "hand-off folder (tools/export.py --format safetensors)".format(cfg_path))
            cfg_path, ckpt_path = None, cfg_path
        handoff = is_handoff(ckpt_path)
        if handoff and task is None:
            try:
                task = handoff_task_name(ckpt_path)
            except CheckpointError as e:
                raise UserInputError(str(e)) from None
        if cfg_path is None:
            if not handoff:
                raise UserInputError("no config given, and {} is not a hand-off folder".format(ckpt_path))
            cfg_path = os.path.join(ckpt_path, CONFIG_FILE)
        raw = read_yaml(cfg_path, "config")
        if task is None:
            task = find_task(config_dataset(raw), cfg_path)
        elif isinstance(task, str):
            try:
                task = get_task(task)
            except KeyError as e:
                raise UserInputError("--task: {}".format(e.args[0])) from None
        try:
            own = handoff and os.path.samefile(cfg_path, os.path.join(ckpt_path, CONFIG_FILE))
            cfg = handoff_config(ckpt_path, task, list(opts)) if own else task.load_config(cfg_path, list(opts))
            task.check_config(cfg, cfg_path)
        except (ConfigError, CheckpointError) as e:
            raise UserInputError(str(e)) from None
        if not (handoff or os.path.isfile(ckpt_path) or is_sharded_checkpoint(ckpt_path)):
            raise UserInputError("checkpoint '{}' does not exist".format(ckpt_path))
        try:
            ckpt = read_handoff(ckpt_path) if handoff else load_checkpoint_file(ckpt_path)
        except CheckpointError as e:
            raise UserInputError(str(e)) from None
        check_same_task(task, cfg, ckpt, ckpt_path, cfg_path)
        task.check_checkpoint(cfg, ckpt, ckpt_path)
        try:
            if isinstance(box_source, dict):
                box_source = BoxSource(device=device, **dict(box_source, cli=cli))
            task_predictor = task.predictor(cfg, ckpt, ckpt_path, device, feature_weights=feature_weights,
                                            box_source=box_source)
            task_predictor.box_source.cli = cli
            # Warnings about weights the build leaves random are dropped: the checkpoint sets every weight.
            with held_random_init_warnings(), checkpoint_sets_weights(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                model = task.build_model(cfg)
        except FileNotFoundError as e:  # a file the config names (BERT folder, answer file, weights)
            raise UserInputError(str(e)) from None
        try:
            load_model_state_dict(model, ckpt["state_dict"], source=ckpt_path)
        except CheckpointError as e:
            raise UserInputError("{} (is {} the config this checkpoint was trained with?)".format(e, cfg_path)) \
                from None
        return cls(task, cfg, model.to(device).eval(), task_predictor, device)

    def preprocess(self, inputs, names=None):
        """``(batch, contexts, errors)`` of a list of input dicts: the collated
        :class:`common.data.collate.Batch` of the readable inputs (the tensors ``model(*batch)`` takes, the
        label placeholder included when the task has one), their contexts, and ``{position: message}`` of the
        inputs that could not be read. ``batch`` is None when none could. ``names``: as in :meth:`__call__`."""
        prepared, errors = self._prepare(inputs, names)
        items = [item for _, item, _ in prepared]
        return (self.collator(items) if items else None), [c for _, _, c in prepared], errors

    def _prepare(self, inputs, names):
        """``([(position, item, context)], {position: message})`` of the inputs (readable ones, errors)."""
        prepared, errors = [], {}
        for position, inp in enumerate(inputs):
            try:
                prepared.append((position, *self.prepare_one(inp, position, names and names[position])))
            except UserInputError as e:
                errors[position] = str(e)
        return prepared, errors

    @staticmethod
    def input_name(inp, position=0, name=None):
        """How messages name an input: ``name``, else its image path, else ``input N``."""
        if name:
            return str(name)
        image = inp.get("image") if isinstance(inp, dict) else None
        return os.fspath(image) if isinstance(image, (str, os.PathLike)) else "input {}".format(position)

    def prepare_one(self, inp, position=0, name=None):
        """``(item, context)`` of one input dict (see :meth:`TaskPredictor.item`); ``name``: how messages name it
        (default :meth:`input_name`).

        Raises:
            UserInputError: not a dict, no ``image``, a bad field or image (names the input).
        """
        name = self.input_name(inp, position, name)
        if not isinstance(inp, dict):
            raise UserInputError("{}: expected a dict with 'image' and the task's fields, got {}".format(
                name, type(inp).__name__))
        if inp.get("image") is None:
            raise UserInputError("{}: 'image' is missing".format(name))
        self.task_predictor.check_input(inp, name)
        image = load_input_image(inp["image"], name)
        return self.task_predictor.item(image, inp, position, name)

    def forward(self, batch):
        """The model's outputs dict (CPU tensors, batch first) on a collated batch, through the inference loop
        (fp32, no grad)."""
        return inference_on_dataset(self.model, [batch], _Collect(self.task_predictor),
                                    self.task_predictor.label_field)

    def _too_long(self, name, length, error):
        """The message of an input whose text does not fit the VL-BERT (``error``: its TextTooLongError)."""
        texts = [k for k in self.task_predictor.fields if k != "boxes"]
        return ("{}: the text ({}) is {} tokens with the model's marks ([CLS], [SEP], ...), over the {} that "
                "NETWORK.VLBERT.max_position_embeddings {} leaves for text; shorten it".format(
                    name, ", ".join(texts), length, error.limit, self.cfg.NETWORK.VLBERT.max_position_embeddings))

    def _forward_fitting(self, prepared, names, errors):
        """The outputs of the prepared inputs (``[(position, item, context)]``) whose text fits the VL-BERT, and
        those inputs; the others go into ``errors`` (``{position: message}``). ``(None, [])`` when none fit."""
        while prepared:
            try:
                return self.forward(self.collator([item for _, item, _ in prepared])), prepared
            except TextTooLongError as e:
                per_input = e.batch_rows // len(prepared)  # VCR: the VL-BERT sees a row per answer choice
                longest = {}
                for row, length in zip(e.rows, e.lengths):
                    longest[row // per_input] = max(length, longest.get(row // per_input, 0))
                for k, length in longest.items():
                    position = prepared[k][0]
                    errors[position] = self._too_long(names[position], length, e)
                prepared = [p for k, p in enumerate(prepared) if k not in longest]
        return None, []

    def attention(self, inp, topk=5, name=None):
        """The attention maps of one input: its prediction (as :meth:`__call__`) and the attention of its first
        VL-BERT sequence (for VCR: the first choice's; QA2R: of its last forward, the query with answer 3), in
        the layout ``pretrain/function/attention_maps.py`` writes (``write_raw`` / ``write_maps``).

        Returns:
            dict: ``result`` (the prediction), ``probs`` float32 numpy ``[layers, heads, T, T]`` (T = text tokens
            + regions + 1, ``[END]``), ``tokens`` (T strings: the word pieces, ``[REGION k]``, ``[END]``),
            ``text`` and ``regions`` (``(start, end)`` token ranges), ``boxes`` (float ``[R, 4]`` pixels of the
            image) and ``image`` (the RGB ``PIL.Image``).
        Raises:
            UserInputError: a bad input (named by ``name``, default :meth:`input_name`), or a model without a
                VL-BERT (names the task).
        """
        vlbert = getattr(self.model, "vlbert", None)
        if vlbert is None:
            raise UserInputError("task '{}': the model has no VL-BERT, so no attention maps".format(self.task.name))
        vlbert = getattr(vlbert, "_module", vlbert)  # VCR's TimeDistributed: the VL-BERT sees each choice as a row
        from common.data.tokenizer import build_tokenizer  # only the maps need the words
        name = self.input_name(inp, 0, name)
        item, context = self.prepare_one(inp, 0, name)
        batch = self.collator([item])
        with _attention_kept(vlbert, {}) as store:
            try:
                outputs = self.forward(batch)
            except TextTooLongError as e:
                raise UserInputError(self._too_long(name, max(e.lengths), e)) from None
        result = self.task_predictor.decode(outputs, [context], topk)[0]
        text_ids, text_mask, object_mask = store["args"][0][0], store["args"][3][0], store["args"][5][0]
        num_text, num_regions = int(text_mask.sum()), int(object_mask.sum())
        size = num_text + num_regions + 1
        probs = torch.stack([p[0, :, :size, :size] for p in store["probs"]]).float().cpu().numpy()
        words = build_tokenizer(self.cfg.NETWORK.BERT_MODEL_NAME).convert_ids_to_tokens(
            text_ids[text_mask].tolist())
        names = list(batch.names)
        scales = batch[names.index("im_info")][0, [2, 3, 2, 3]]
        boxes = batch[names.index("boxes")][0, :num_regions, :4] / scales
        return {"result": dict({k: v for k, v in inp.items() if isinstance(v, (str, int, float, list))},
                               **{k: v for k, v in result.items() if not k.startswith("_")}),
                "probs": probs, "tokens": words + ["[REGION {}]".format(k) for k in range(num_regions)] + ["[END]"],
                "text": (0, num_text), "regions": (num_text, num_text + num_regions), "boxes": boxes.numpy(),
                "image": load_input_image(inp["image"], name)}

    def __call__(self, inputs, topk=5, strict=True, names=None):
        """Predictions of one input dict or a list of them (one batch), in input order.

        Args:
            inputs: a dict (see the module docstring) or a list of dicts.
            topk: predictions kept per input (and per ``[MASK]``).
            strict: raise on the first bad input; False: keep it in the output as ``{"error": message}``.
            names: how messages name each input (e.g. an uploaded file's own name); default :meth:`input_name`.
        Returns:
            list of dicts, one per input: its JSON-able fields (``image`` when it is a path), ``predictions``
            and the task's extra keys; a bad input (``strict=False``) gets ``error`` and no predictions.
        Raises:
            UserInputError: a bad input, with ``strict`` (names it and what was expected): a missing or unreadable
                image, a bad field, a text longer than the VL-BERT's positions (names the limit).
        """
        inputs = [inputs] if isinstance(inputs, dict) else list(inputs)
        names = [self.input_name(inp, k, names and names[k]) for k, inp in enumerate(inputs)]
        prepared, errors = self._prepare(inputs, names)
        if errors and strict:
            raise UserInputError(errors[min(errors)])
        outputs, prepared = self._forward_fitting(prepared, names, errors)
        if errors and strict:
            raise UserInputError(errors[min(errors)])
        decoded = []
        if outputs is not None:
            decoded = self.task_predictor.decode(outputs, [c for _, _, c in prepared], topk)
        results, done = [], iter(decoded)
        for position, inp in enumerate(inputs):
            out = {k: v for k, v in inp.items() if isinstance(v, (str, int, float, list)) or v is None} \
                if isinstance(inp, dict) else {}
            if position in errors:
                out["error"] = errors[position]
            else:
                out.update({k: v for k, v in next(done).items() if not k.startswith("_")})
            results.append(out)
        return results


@contextlib.contextmanager
def _attention_kept(vlbert, store):
    """Inside: every forward of the VL-BERT ``vlbert`` also stores its inputs (``store["args"]``) and its
    attention probabilities (``store["probs"]``, per layer [B, heads, L, L]; the eager attention path); its
    outputs are unchanged."""
    encoder = vlbert.encoder
    original = encoder.forward

    def forward(hidden_states, attention_mask, output_all_encoded_layers=True, output_attention_probs=False):
        encoded, probs = original(hidden_states, attention_mask, output_all_encoded_layers,
                                  output_attention_probs=True)
        store["probs"] = probs
        return (encoded, probs) if output_attention_probs else encoded

    encoder.forward = forward  # this instance only, removed on exit
    handle = vlbert.register_forward_pre_hook(lambda module, args: store.update(args=args))
    try:
        yield store
    finally:
        del encoder.forward
        handle.remove()


def _first_dataset_cfg(cfg):
    """A view of a multi-data-set config with its first DATASET entry (for the collator's keys)."""
    from common.data.multitask import dataset_configs
    return dataset_configs(cfg)[0]
