"""Boxes for images: a regular grid (no detector needed), a boxes file, or a torchvision two-stage
detector selecting regions the way the bottom-up-attention features did.

The detector's selection follows ``generate_tsv.py`` of bottom-up-attention (Anderson et al., CVPR
2018; github peteanderson80/bottom-up-attention): the boxes are the detector's proposals (not the
class-regressed boxes), each proposal gets the best score it keeps through a per-class NMS, and the
proposals with that score >= 0.2 are kept, at least 10 and at most 100 per image. Its NMS IoU is
py-faster-rcnn's ``TEST.NMS`` default, 0.3.
"""
import os
import re
import warnings

import torch
import torchvision
from torchvision.ops import batched_nms
from torchvision.transforms.functional import pil_to_tensor

from common.errors import UserInputError
from common.fileio.safe_load import load_tensors

from .loading import load_json

__all__ = ["BOX_SOURCES", "CONF_THRESH", "DEFAULT_DETECTOR", "GRID_PATTERN", "MAX_BOXES", "MIN_BOXES", "NMS_IOU",
           "BoxSource", "DetectorBoxes", "grid_boxes", "parse_grid", "read_box_list", "select_regions"]

# Bottom-up-attention's selection (module docstring).
CONF_THRESH = 0.2
NMS_IOU = 0.3
MIN_BOXES = 10
MAX_BOXES = 100
# Keys of the class layer in torchvision's two-stage detectors; its rows give the number of classes.
_CLS_SCORE = "roi_heads.box_predictor.cls_score.weight"
# Mismatched keys named in an error, per kind.
_SHOW_KEYS = 5
# A grid shape, 'ROWSxCOLS' with both >= 1 (--grid, DATASET.GRID_BOXES).
GRID_PATTERN = re.compile(r"\s*([1-9]\d*)\s*[xX]\s*([1-9]\d*)\s*")


def parse_grid(text, setting="--grid"):
    """``(rows, cols)`` of ``'ROWSxCOLS'`` (e.g. ``'4x4'``); None for ``''``.

    Raises:
        UserInputError: another spelling or a zero (names ``setting``, the option or config key).
    """
    if not text:
        return None
    match = GRID_PATTERN.fullmatch(text)
    if match is None:
        raise UserInputError("{}: expected ROWSxCOLS such as '4x4', got {!r}".format(setting, text))
    return int(match.group(1)), int(match.group(2))


def grid_boxes(width, height, rows, cols, whole_image=True, name="image"):
    """The cells of a ``rows x cols`` grid over a ``width x height`` image, plus the whole image.

    Cell edges are ``round(i * width / cols)`` (and likewise for rows), so cells tile the image with
    no gap or overlap; a cell spans pixels ``x1 .. x2`` inclusive (the reference's ``x2 = w - 1``
    convention for the whole-image box).

    Args:
        width, height: image size in pixels.
        rows, cols: grid shape, each >= 1.
        whole_image: put ``[0, 0, width - 1, height - 1]`` first.
        name: how errors name the image (its path).

    Returns:
        float32 ``[whole_image + rows * cols, 4]`` boxes ``(x1, y1, x2, y2)`` in pixels, row-major.

    Raises:
        UserInputError: a grid shape < 1, or more cells than pixels along a side (names both sizes).
    """
    if rows < 1 or cols < 1:
        raise UserInputError("grid {}x{}: rows and columns must be >= 1".format(rows, cols))
    if cols > width or rows > height:
        raise UserInputError("{}: a {}x{} (rows x columns) grid does not fit an image of {}x{} pixels "
                             "(width x height)".format(name, rows, cols, width, height))
    xs = [round(i * width / cols) for i in range(cols + 1)]
    ys = [round(j * height / rows) for j in range(rows + 1)]
    cells = [[xs[i], ys[j], xs[i + 1] - 1, ys[j + 1] - 1] for j in range(rows) for i in range(cols)]
    if whole_image:
        cells.insert(0, [0, 0, width - 1, height - 1])
    return torch.tensor(cells, dtype=torch.float32)


def select_regions(boxes, probs, conf_thresh=CONF_THRESH, nms_iou=NMS_IOU, min_boxes=MIN_BOXES,
                   max_boxes=MAX_BOXES):
    """Bottom-up-attention's choice of regions among a detector's proposals.

    Args:
        boxes: float ``[P, 4]`` proposals ``(x1, y1, x2, y2)``.
        probs: float ``[P, C]`` softmax class distribution of each proposal, column 0 background.
        conf_thresh: smallest kept score; nms_iou: IoU of the per-class NMS;
        min_boxes, max_boxes: bounds on the number kept (fewer when there are fewer proposals).
    Returns:
        int64 ``[K]`` indices into the proposals, best score first (ties in proposal order).
    """
    num, classes = probs.shape[0], probs.shape[1] - 1
    if num == 0 or classes == 0:
        return torch.zeros(0, dtype=torch.int64)
    scores = probs[:, 1:].reshape(-1)  # proposal-major: candidate i * classes + c
    keep = batched_nms(boxes.float().repeat_interleave(classes, 0), scores.float(),
                       torch.arange(classes, device=probs.device).repeat(num), nms_iou)
    best = torch.zeros(num, dtype=scores.dtype, device=scores.device)
    best.scatter_reduce_(0, keep // classes, scores[keep], reduce="amax")
    count = min(max(int((best >= conf_thresh).sum()), min_boxes), max_boxes, num)
    return torch.sort(best, descending=True, stable=True).indices[:count]


class DetectorBoxes:
    """A torchvision two-stage detector (Faster / Mask / Keypoint R-CNN) giving each image's regions
    and their class distributions, as :func:`select_regions` chooses them.

    The model is built with no weights (nothing is downloaded) and its weights read weights-only from
    ``weights`` (a ``.pth`` state dict, a training checkpoint holding it under ``model``, or a
    ``.safetensors`` file); the number of classes comes from the file. COCO weights are torchvision's
    published files (``data/PREPARE_DATA.md``, "Features for your own images").

    Args:
        name: a torchvision detection model (``torchvision.models.list_models(torchvision.models.detection)``).
        weights: the weights file.
        device: torch device.
        min_size, max_size: the detector's own resize (torchvision's defaults: 800, 1333).
        conf_thresh, nms_iou, min_boxes, max_boxes: see :func:`select_regions`.
    Raises:
        UserInputError: an unknown or single-stage model name (lists the usable ones), or weights that do
            not fit the model (names the missing, unexpected and wrongly shaped keys).
        FileNotFoundError / common.fileio.safe_load.UnreadableFileError: no such file, or not a weights file.
    """

    def __init__(self, name, weights, device="cpu", min_size=800, max_size=1333, conf_thresh=CONF_THRESH,
                 nms_iou=NMS_IOU, min_boxes=MIN_BOXES, max_boxes=MAX_BOXES):
        usable = [n for n in torchvision.models.list_models(torchvision.models.detection) if "rcnn" in n]
        if name not in usable:
            raise UserInputError("--detector {}: not a torchvision two-stage detector (the class distribution per "
                                 "region comes from its RoI head); use one of {}".format(name, ", ".join(usable)))
        state = load_tensors(weights, "--detector-weights file")
        if isinstance(state, dict) and isinstance(state.get("model"), dict):  # torchvision's training checkpoints
            state = state["model"]
        if not isinstance(state, dict) or _CLS_SCORE not in state:
            raise UserInputError("--detector-weights {}: not a {} state dict (no '{}')".format(weights, name,
                                                                                              _CLS_SCORE))
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None,
                                             num_classes=state[_CLS_SCORE].shape[0], min_size=min_size,
                                             max_size=max_size)
        _check_state(model.state_dict(), state, weights, name)
        model.load_state_dict(state)
        self.model = model.eval().to(device)
        self.device = device
        self.num_classes = state[_CLS_SCORE].shape[0]
        self.selection = dict(conf_thresh=conf_thresh, nms_iou=nms_iou, min_boxes=min_boxes, max_boxes=max_boxes)

    @torch.no_grad()
    def __call__(self, image):
        """Regions of one ``PIL.Image``: (float32 ``[K, 4]`` boxes in pixels of the image, float32
        ``[K, C]`` class distributions, column 0 background), best score first."""
        pixels = pil_to_tensor(image).to(self.device, torch.float32) / 255.0
        m = self.model
        batch, _ = m.transform([pixels])
        features = m.backbone(batch.tensors)
        proposals = m.rpn(batch, features)[0]
        pooled = m.roi_heads.box_head(m.roi_heads.box_roi_pool(features, proposals, batch.image_sizes))
        probs = torch.softmax(m.roi_heads.box_predictor(pooled)[0].float(), -1)
        # Proposals are in the resized image's pixels: back to the original's.
        (h, w), (h0, w0) = batch.image_sizes[0], pixels.shape[1:]
        boxes = proposals[0] * torch.tensor([w0 / w, h0 / h, w0 / w, h0 / h], device=self.device)
        keep = select_regions(boxes, probs, **self.selection)
        return boxes[keep].float().cpu(), probs[keep].cpu()


def _check_state(expected, given, path, name):
    """Raise UserInputError naming the keys of ``given`` that do not fit ``expected`` (state dicts)."""
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    shapes = ["{} {} (model: {})".format(k, tuple(given[k].shape), tuple(v.shape)) for k, v in expected.items()
              if k in given and tuple(given[k].shape) != tuple(v.shape)]
    problems = ["{} {} key(s): {}{}".format(len(keys), kind, ", ".join(keys[:_SHOW_KEYS]),
                                            ", ..." if len(keys) > _SHOW_KEYS else "")
                for kind, keys in (("missing", missing), ("unexpected", unexpected), ("wrongly shaped", shapes))
                if keys]
    if problems:
        raise UserInputError("--detector-weights {}: does not fit torchvision's {}: {}".format(
            path, name, "; ".join(problems)))


def read_box_list(path):
    """The entries of a boxes file, each with a float32 ``[N, 4]`` tensor under ``boxes``.

    Raises:
        UserInputError: not a list of ``{image_id, image, boxes}``, or a box row with fewer than 4
            numbers (names the file and the entry).
    """
    entries = load_json(path)
    if not isinstance(entries, list):
        raise UserInputError("{}: expected a JSON list of {{\"image_id\", \"image\", \"boxes\"}}".format(path))
    out = []
    for i, e in enumerate(entries):
        if not (isinstance(e, dict) and {"image_id", "image", "boxes"} <= e.keys()):
            raise UserInputError("{}: entry {} needs 'image_id', 'image' and 'boxes'".format(path, i))
        rows = e["boxes"]
        if not (isinstance(rows, list) and all(isinstance(r, list) and len(r) >= 4 for r in rows)):
            raise UserInputError("{}: image_id {}: 'boxes' must be a list of [x1, y1, x2, y2] rows".format(
                path, e["image_id"]))
        try:
            boxes = torch.tensor([r[:4] for r in rows], dtype=torch.float32).reshape(-1, 4)
        except (TypeError, ValueError):
            raise UserInputError("{}: image_id {}: box coordinates must be numbers".format(
                path, e["image_id"])) from None
        out.append(dict(e, boxes=boxes))
    return out


BOX_SOURCES = ("file", "grid", "detector")
DEFAULT_DETECTOR = "fasterrcnn_resnet50_fpn_v2"


class BoxSource:
    """Boxes of one raw image from a box source of ``tools/extract_features.py``: ``source(image, name)``
    -> float32 ``[K, 4]`` ``(x1, y1, x2, y2)`` pixels of ``image`` (the whole image not included).

    Args:
        kind: 'grid' (``grid`` ROWSxCOLS cells), 'detector' (:class:`DetectorBoxes` of ``detector`` with
            ``detector_weights``) or 'file' (the entries of the boxes files ``box_files``, found by their
            ``image`` path, or its file name, as ``name`` gives it).
        device: the detector's torch device.
        fallback: kind 'file': the box source (a :class:`BoxSource` or a dict of its arguments, a 'grid' or
            'detector' one) of the images the files do not list, with one warning per source; None: such an
            image is refused. A run's recorded file source (``feature_extractor.json``) lists its training
            photos only; its fallback is how a new photo gets boxes.
        cli: the messages name the command line's ``--box-source`` (True) or the Python ``box_source=``.
        detector_kwargs: further :class:`DetectorBoxes` arguments (sizes, selection).
    Raises:
        UserInputError: an unknown kind, a bad grid, a detector without weights, a file source without files,
            a fallback of kind 'file'; on call without a fallback: an image the boxes files do not list (names
            the files, the image and the setting to change).
    """

    def __init__(self, kind, grid="4x4", box_files=(), detector=DEFAULT_DETECTOR, detector_weights=None,
                 device="cpu", fallback=None, cli=False, **detector_kwargs):
        self.cli = cli
        if kind not in BOX_SOURCES:
            raise UserInputError("{}: expected one of {}, got {!r}".format(
                "--box-source" if cli else "box_source kind", ", ".join(BOX_SOURCES), kind))
        self.kind = kind
        self.grid = parse_grid(grid, "--grid" if cli else "box_source grid") if kind == "grid" else None
        self.detector = None
        if kind == "detector":
            if not detector_weights:
                raise UserInputError("{} needs {} (nothing is downloaded; see data/PREPARE_DATA.md, 'Features for "
                                     "your own images')".format(self.setting("detector"), self._arg("detector_weights")))
            self.detector = DetectorBoxes(detector, detector_weights, device, **detector_kwargs)
        self.box_files = [box_files] if isinstance(box_files, str) else list(box_files)
        self.boxes = {}
        if kind == "file":
            if not self.box_files:
                raise UserInputError("{} needs {} (a JSON list of {{\"image_id\", \"image\", \"boxes\"}})".format(
                    self.setting("file"), self._arg("box_files")))
            for path in self.box_files:
                for entry in read_box_list(path):
                    self.boxes.setdefault(_norm(entry["image"]), entry["boxes"])
                    self.boxes.setdefault(_norm(entry["image"]).rsplit("/", 1)[-1], entry["boxes"])
        if isinstance(fallback, dict):
            fallback = BoxSource(device=device, **fallback)
        if fallback is not None and (kind != "file" or fallback.kind == "file"):
            raise UserInputError("box source fallback: only a 'file' source takes one, and it is a 'grid' or "
                                 "'detector' source; got {} for {}".format(fallback.kind, kind))
        self.fallback = fallback
        self.warned = False

    def __call__(self, image, name="image"):
        if self.kind == "grid":
            return grid_boxes(image.size[0], image.size[1], *self.grid, whole_image=False, name=name)
        if self.kind == "detector":
            return self.detector(image)[0]
        key = _norm(name)
        for candidate in (key, key.rsplit("/", 1)[-1]):
            if candidate in self.boxes:
                return self.boxes[candidate].clone()
        if self.fallback is None:
            raise UserInputError("{}: no boxes for this image in the box file(s) {} (entries are found by their "
                                 "'image' path or file name); give its boxes or use {}".format(
                                     name, ", ".join(self.box_files), self.setting("grid")))
        if not self.warned:
            self.warned = True
            warnings.warn("{}: not in the box file(s) {}, which list the photos the model was trained on; it and "
                          "every other photo they do not list get the recorded boxes for new photos, {} (another "
                          "source: {})".format(name, ", ".join(self.box_files), self.fallback.describe(),
                                               "--box-source" if self.cli else "box_source="), stacklevel=2)
        return self.fallback(image, name)

    def setting(self, kind):
        """How the interface in use (:attr:`cli`) chooses a source of ``kind``: ``--box-source grid`` or
        ``box_source={'kind': 'grid'}``."""
        return "--box-source {}".format(kind) if self.cli else "box_source={{'kind': '{}'}}".format(kind)

    def _arg(self, name):
        """``detector_weights`` -> ``--detector-weights FILE`` (command line) or ``'detector_weights'`` (Python)."""
        flag = {"box_files": "--box-file"}.get(name, "--" + name.replace("_", "-"))
        return "{} FILE".format(flag) if self.cli else "'{}'".format(name)

    def describe(self):
        """The source in words, for outputs and logs: ``'grid 4x4'``, ``'detector <name>'``, ``'file <paths>'``."""
        if self.kind == "grid":
            return "grid {}x{}".format(*self.grid)
        if self.kind == "detector":
            return "detector {}".format(type(self.detector.model).__name__)
        fallback = ", else {}".format(self.fallback.describe()) if self.fallback is not None else ""
        return "file {}{}".format(", ".join(self.box_files), fallback)


def _norm(path):
    return os.path.normpath(str(path)).replace(os.sep, "/")
