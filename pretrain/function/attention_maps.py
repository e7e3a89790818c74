"""Writing one item's attention: the raw probabilities (``.npy`` + a JSON of its tokens and boxes) and PNG maps.

Files per item (``<out>/``; ``ID`` = the image id):

- ``attention_probs/ID.npy``: float32 [layers, heads, T, T], T = text tokens + regions + 1 (``[END]``); entry
  ``[l, h, q, k]`` is the probability with which token q attends to token k in layer l, head h (each row sums
  to 1). The reference's file name and axes, cut to the item's own tokens.
- ``attention_probs/ID.json``: ``tokens`` (T strings: ``[CLS]`` word pieces ``[SEP]``, then ``[IMAGE]`` /
  ``[REGION k]``, then ``[END]``), ``text`` and ``regions`` (``[start, end)`` token ranges), ``boxes`` (one
  ``[x1, y1, x2, y2]`` per region, pixels of the image file), ``image``, ``image_id``, ``caption``,
  ``image_size`` ``[width, height]``, ``checkpoint``, ``axes``.
- ``maps/ID/layerLL_word_to_region.png`` and ``layerLL_region_to_word.png`` (LL = 01, 02, ...): the image with
  numbered boxes, then one panel per head: the probabilities of the text tokens (rows) over the regions
  (columns), or of the regions over the text tokens.
- ``maps/ID/summary_word_to_region.png``, ``summary_region_to_word.png``: averaged over layers and heads, one
  panel per caption word: the image with each region painted with the word's attention to it (or its attention
  to the word; where regions overlap, the smaller region shows), boxes outlined.
"""
import json
import math
import os

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common.inference.drawing import painted_regions, thumbnail  # noqa: E402

AXES = ("[layers, heads, query token, key token]: row [l, h, q] holds the attention probabilities of token q "
        "over all tokens in layer l, head h (sums to 1)")
# Longest side of the image in the figures, pixels (smaller is faster to paint, larger shows more).
THUMBNAIL = 256
# Heads per row of a layer figure.
HEAD_COLUMNS = 4


def file_stem(image_id):
    """``image_id`` as a file name (path separators replaced)."""
    return str(image_id).replace(os.sep, "_").replace("/", "_")


def write_raw(out, image_id, probs, record):
    """Write ``attention_probs/ID.npy`` (``probs`` float32 [layers, heads, T, T]) and ``ID.json`` (``record``
    plus ``axes``); returns the .npy path."""
    folder = os.path.join(out, "attention_probs")
    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, file_stem(image_id))
    np.save(stem + ".npy", probs.astype(np.float32))
    with open(stem + ".json", "w") as f:
        json.dump(dict(record, axes=AXES, dtype="float32", shape=list(probs.shape)), f, indent=1)
    return stem + ".npy"


def _outline(ax, boxes, numbers=False, color="white"):
    for k, (x1, y1, x2, y2) in enumerate(boxes):
        ax.add_patch(matplotlib.patches.Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color=color, lw=0.8))
        if numbers:
            ax.text(x1 + 2, y1 + 2, str(k), color="black", fontsize=7, va="top",
                    bbox=dict(facecolor="yellow", alpha=0.8, pad=0.5, lw=0))


def _grid(panels, columns, panel_size):
    rows = math.ceil(panels / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(panel_size[0] * columns, panel_size[1] * rows), squeeze=False)
    for ax in axes.flat[panels:]:
        ax.axis("off")
    return fig, list(axes.flat)


def _save(fig, path, colour_bar=None):
    """Lay out (room for the title, and for ``colour_bar``, an image of the figure, on the right), write, close."""
    fig.tight_layout(rect=(0, 0, 1.0, 0.97))
    if colour_bar:
        fig.subplots_adjust(right=0.92)
        fig.colorbar(colour_bar, cax=fig.add_axes((0.94, 0.1, 0.015, 0.8)))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def layer_figure(path, title, thumb, boxes, matrices, row_labels, col_labels):
    """One layer: the image with numbered boxes, then a heat map per head (``matrices`` [heads, rows, cols]),
    all heads on one colour scale (from 0 to the layer's largest value)."""
    heads = len(matrices)
    columns = min(HEAD_COLUMNS, heads + 1)
    size = (max(3.0, 0.28 * len(col_labels) + 1.2), max(2.5, 0.22 * len(row_labels) + 1.0))
    fig, axes = _grid(heads + 1, columns, size)
    axes[0].imshow(thumb)
    _outline(axes[0], boxes, numbers=True, color="yellow")
    axes[0].set_title("regions", fontsize=9)
    axes[0].axis("off")
    vmax = float(matrices.max()) or 1.0
    for h, ax in enumerate(axes[1:heads + 1]):
        ax.imshow(matrices[h], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_title("head {}".format(h), fontsize=9)
        ax.set_xticks(range(len(col_labels)))
        ax.set_xticklabels(col_labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(row_labels)))
        ax.set_yticklabels(row_labels, fontsize=6)
    fig.suptitle("{} (colour scale 0 to {:.3f})".format(title, vmax), fontsize=10)
    return _save(fig, path)


def summary_figure(path, title, thumb, boxes, values, words):
    """Averaged attention: one panel per word, ``values`` [words, regions] painted over the image."""
    columns = min(HEAD_COLUMNS, len(words))
    height, width = thumb.shape[:2]
    fig, axes = _grid(len(words), columns, (3.0, 3.0 * height / width + 0.4))
    vmax = float(values.max()) or 1.0
    for ax, word, row in zip(axes, words, values):
        ax.imshow(thumb)
        heat = ax.imshow(painted_regions(thumb.shape, boxes, row), cmap="inferno", alpha=0.6, vmin=0.0, vmax=vmax)
        _outline(ax, boxes)
        ax.set_title(word, fontsize=9)
        ax.axis("off")
    fig.suptitle("{} (colour scale 0 to {:.3f})".format(title, vmax), fontsize=10)
    return _save(fig, path, colour_bar=heat)


def write_maps(out, image_id, probs, tokens, text, regions, image, boxes):
    """Write the PNG maps of one item (see the module docstring).

    Args:
        probs: float32 [layers, heads, T, T]. tokens: T strings. text, regions: ``(start, end)`` token ranges.
        image: ``PIL.Image`` the boxes refer to. boxes: [R, 4] pixels of ``image``, R = regions' length.
    Returns:
        list of the written paths.
    """
    folder = os.path.join(out, "maps", file_stem(image_id))
    os.makedirs(folder, exist_ok=True)
    thumb, small_boxes = thumbnail(image, boxes, THUMBNAIL)
    thumb = np.asarray(thumb)
    t, r = slice(*text), slice(*regions)
    words, region_labels = tokens[t], [str(k) for k in range(regions[1] - regions[0])]
    paths = []
    for layer, per_head in enumerate(probs, 1):
        paths.append(layer_figure(os.path.join(folder, "layer{:02d}_word_to_region.png".format(layer)),
                                  "layer {}: text token (row) -> region (column)".format(layer), thumb,
                                  small_boxes, per_head[:, t, r], words, region_labels))
        paths.append(layer_figure(os.path.join(folder, "layer{:02d}_region_to_word.png".format(layer)),
                                  "layer {}: region (row) -> text token (column)".format(layer), thumb,
                                  small_boxes, per_head[:, r, t], region_labels, words))
    mean = probs.mean(axis=(0, 1))
    # The caption's words; [CLS] / [SEP] only when the caption is empty.
    rows = [q for q in range(*text) if tokens[q] not in ("[CLS]", "[SEP]")] or list(range(*text))
    paths.append(summary_figure(os.path.join(folder, "summary_word_to_region.png"),
                                "mean over layers and heads: word -> regions", thumb, small_boxes,
                                mean[rows, r], [tokens[q] for q in rows]))
    paths.append(summary_figure(os.path.join(folder, "summary_region_to_word.png"),
                                "mean over layers and heads: regions -> word", thumb, small_boxes,
                                mean[r, rows].T, [tokens[q] for q in rows]))
    return paths
