"""Attention maps through the real entry point, ``pretrain/vis_attention_maps.py``, with the shipped
``cfgs/pretrain/vis_attention_maps_coco.yaml`` shrunk by ``--opts`` (2 layers of 32 units, 2 heads, ResNet-18 on
32-48 px images), on a tiny COCO captions folder (plain and ``zip@/``) and a folder of images + captions JSON.

Checkpoints: a pretraining model's and a VCR model's state dicts of the tiny architecture with random values
(every tensor differs from a fresh init), so the maps can only match when the file's weights were loaded.
"""
import json
import math
import os
import shutil
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from tests import tiny_vcr

ROOT = tiny_vcr.ROOT
ENTRY = os.path.join(ROOT, "pretrain", "vis_attention_maps.py")
CFG = os.path.join(ROOT, "cfgs", "pretrain", "vis_attention_maps_coco.yaml")
VCR_CFG = os.path.join(ROOT, "cfgs", "vcr", "base_q2a_4x16G_fp16.yaml")
LAYERS, HEADS, HIDDEN = 2, 2, tiny_vcr.HIDDEN
VOCAB = tiny_vcr.SPECIAL_TOKENS + sorted("a an and blue cat dog on red sits square the mat with".split())
# (id, file, size, caption, instance boxes [x, y, w, h])
COCO = [(9, "COCO_val_9.jpg", (48, 40), "a red square on a blue mat", [[4, 4, 20, 16], [30, 10, 12, 25]]),
        (25, "COCO_val_25.jpg", (40, 48), "the cat sits", [[0, 0, 40, 48]]),
        (30, "COCO_val_30.jpg", (44, 44), "a dog", [])]  # no instance: left out, as the reference does


def _arch(bert, resnet=""):
    return {"SCALES": [32, 48], "NETWORK.BERT_MODEL_NAME": bert, "NETWORK.IMAGE_NUM_LAYERS": 18,
            "NETWORK.IMAGE_PRETRAINED": resnet, "NETWORK.IMAGE_C5_DILATED": False,
            "NETWORK.IMAGE_ROI_POOLED_SIZE": 4, "NETWORK.IMAGE_FINAL_DIM": HIDDEN,
            "NETWORK.VLBERT.hidden_size": HIDDEN, "NETWORK.VLBERT.visual_size": HIDDEN,
            "NETWORK.VLBERT.num_hidden_layers": LAYERS, "NETWORK.VLBERT.num_attention_heads": HEADS,
            "NETWORK.VLBERT.intermediate_size": 64, "NETWORK.VLBERT.max_position_embeddings": 128,
            "NETWORK.VLBERT.vocab_size": len(VOCAB), "NETWORK.PARTIAL_PRETRAIN": ""}


def _opts(values):
    out = []
    for k, v in values.items():
        out += [k, v if isinstance(v, str) else json.dumps(v)]
    return out


def _random_checkpoint(model, path, seed):
    """Save ``model``'s keys with random values (one value per shared tensor, as a real file; BatchNorm
    variances positive)."""
    g = torch.Generator().manual_seed(seed)
    values = {}
    for k, v in model.state_dict().items():
        if v.is_floating_point() and v.data_ptr() not in values:
            r = torch.randn(v.shape, generator=g)
            values[v.data_ptr()] = r.abs() + 0.5 if k.endswith("running_var") else r * 0.5
    torch.save({"state_dict": {k: values[v.data_ptr()] if v.is_floating_point() else v
                               for k, v in model.state_dict().items()}}, path)
    return path


def _image(path, size, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """COCO folders (plain, zip), a user folder, a BERT folder and pretraining / VCR checkpoints."""
    root = tmp_path_factory.mktemp("attention")
    bert = str(root / "bert")
    tiny_vcr._bert_folder(bert, VOCAB)
    coco = root / "coco"
    (coco / "annotations").mkdir(parents=True)
    (coco / "val2017").mkdir()
    images, captions, instances = [], [], []
    for n, (image_id, name, size, caption, boxes) in enumerate(COCO):
        _image(coco / "val2017" / name, size, n)
        images.append({"id": image_id, "file_name": name, "width": size[0], "height": size[1]})
        captions += [{"id": 100 + n, "image_id": image_id, "caption": caption},
                     {"id": 200 + n, "image_id": image_id, "caption": "a second caption"}]
        instances += [{"id": 300 + n * 10 + k, "image_id": image_id, "bbox": b} for k, b in enumerate(boxes)]
    for kind, anns in (("captions", captions), ("instances", instances)):
        with open(coco / "annotations" / "{}_val2017.json".format(kind), "w") as f:
            json.dump({"images": images[::-1], "annotations": anns}, f)
    coco_zip = root / "coco_zip"
    shutil.copytree(coco / "annotations", coco_zip / "annotations")
    with zipfile.ZipFile(coco_zip / "val2017.zip", "w") as z:
        for _, name, *_ in COCO:
            z.write(coco / "val2017" / name, "val2017/" + name)

    photos = root / "photos"
    photos.mkdir()
    _image(photos / "one.jpg", (40, 32), 7)
    (photos / "broken.jpg").write_bytes(b"not an image")
    with open(root / "captions.json", "w") as f:
        json.dump([{"image": "one.jpg", "caption": "a cat on a mat"},
                   {"image": "broken.jpg", "caption": "a dog"}], f)

    from pretrain.task import TASK as PRETRAIN
    from vcr.task import TASK as VCR

    pre_cfg = PRETRAIN.load_config(os.path.join(ROOT, "cfgs", "pretrain", "base_e2e_16x16G_fp16.yaml"),
                                   _opts(_arch(bert)))
    vcr_cfg = VCR.load_config(VCR_CFG, _opts(dict(_arch(bert), **{"DATASET.MASK_SIZE": 2})))
    with pytest.warns(Warning):  # random ResNet
        pretrain = _random_checkpoint(PRETRAIN.build_model(pre_cfg), str(root / "pretrain.model"), 1)
        vcr = _random_checkpoint(VCR.build_model(vcr_cfg), str(root / "vcr.model"), 2)
    torch.save({"state_dict": {"final_mlp.1.weight": torch.zeros(1, HIDDEN)}}, str(root / "heads_only.model"))
    return {"root": root, "bert": bert, "coco": str(coco), "coco_zip": str(coco_zip), "photos": str(photos),
            "captions": str(root / "captions.json"), "pretrain": pretrain, "vcr": vcr,
            "heads_only": str(root / "heads_only.model")}


def run(inputs, out, ckpt, *args, **opts):
    values = dict(_arch(inputs["bert"]), **{"DATASET.DATASET_PATH": inputs["coco"]})
    values.update({k.replace("__", "."): v for k, v in opts.items()})
    return tiny_vcr.run_script(ENTRY, ["--cfg", CFG, "--ckpt", ckpt, "--out", str(out)] + list(args)
                               + ["--opts"] + _opts(values))


def expected_pngs():
    names = ["layer{:02d}_{}.png".format(l, d) for l in range(1, LAYERS + 1) for d in ("word_to_region",
                                                                                       "region_to_word")]
    return sorted(names + ["summary_region_to_word.png", "summary_word_to_region.png"])


def test_shipped_config_on_coco_writes_probabilities_tokens_and_maps(inputs, tmp_path, capsys):
    assert run(inputs, tmp_path, inputs["pretrain"], "--max-items", "1") == 0
    printed = capsys.readouterr().out
    assert "loaded" in printed and "vlbert.* " in printed and "image_feature_extractor.* " in printed
    assert "attention maps of 1 item(s); 0 skipped" in printed
    assert sorted(os.listdir(tmp_path / "attention_probs")) == ["9.json", "9.npy"]
    assert sorted(os.listdir(tmp_path / "maps")) == ["9"]
    assert sorted(os.listdir(tmp_path / "maps" / "9")) == expected_pngs()
    with open(tmp_path / "attention_probs" / "9.json") as f:
        record = json.load(f)
    # [CLS] a red square on a blue mat [SEP], the whole image, 2 instance boxes (x2 = x + w - 1), [END]
    assert record["tokens"] == ["[CLS]", "a", "red", "square", "on", "a", "blue", "mat", "[SEP]", "[IMAGE]",
                                "[REGION 0]", "[REGION 1]", "[END]"]
    assert record["text"] == [0, 9] and record["regions"] == [9, 12] and record["image_size"] == [48, 40]
    assert record["boxes"] == [[0, 0, 47, 39], [4, 4, 23, 19], [30, 10, 41, 34]]
    assert record["caption"] == "a red square on a blue mat"  # the first caption
    probs = np.load(tmp_path / "attention_probs" / "9.npy")
    assert probs.dtype == np.float32 and probs.shape == (LAYERS, HEADS, 13, 13) and record["shape"] == [2, 2, 13, 13]
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_saved_probabilities_are_softmax_of_the_models_queries_and_keys(inputs, tmp_path):
    """Layer 1's probabilities, computed by hand from its query / key projections of the layer's input."""
    from pretrain.task import TASK
    from common.data.collate import BatchCollator, canvas_scales
    from pretrain.function.vis import build_items, build_model

    opts = _opts(dict(_arch(inputs["bert"]), **{"DATASET.DATASET_PATH": inputs["coco"]}))
    assert run(inputs, tmp_path, inputs["pretrain"], "--raw-only", "--max-items", "1") == 0
    cfg = TASK.load_config(CFG, opts)
    model, _ = build_model(cfg, inputs["pretrain"])
    dataset = build_items(cfg)
    batch = BatchCollator(dataset.data_names, scales=canvas_scales(cfg))([dataset.load(0)[0]])
    seen = {}
    attention = model.vlbert.encoder.layer[1].attention.self
    handle = attention.register_forward_hook(lambda m, args, out: seen.update(h=args[0]))
    with torch.no_grad():
        model(*batch)
        handle.remove()
        h = seen["h"][0]  # [T, H]: one item, no padding
        d = HIDDEN // HEADS
        q = attention.query(h).view(-1, HEADS, d).transpose(0, 1)
        k = attention.key(h).view(-1, HEADS, d).transpose(0, 1)
        by_hand = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1).numpy()
    saved = np.load(tmp_path / "attention_probs" / "9.npy")
    np.testing.assert_allclose(saved[1], by_hand, atol=1e-6)


def test_zip_folder_gives_the_same_maps(inputs, tmp_path):
    assert run(inputs, tmp_path / "plain", inputs["pretrain"], "--raw-only") == 0
    assert run(inputs, tmp_path / "zip", inputs["pretrain"], "--raw-only", DATASET__DATASET_PATH=inputs["coco_zip"],
               DATASET__ZIP_MODE=True) == 0
    assert sorted(os.listdir(tmp_path / "zip" / "attention_probs")) == ["25.json", "25.npy", "9.json", "9.npy"]
    for name in ("9.npy", "25.npy"):  # exact: the same bytes read two ways, then one computation
        np.testing.assert_array_equal(np.load(tmp_path / "zip" / "attention_probs" / name),
                                      np.load(tmp_path / "plain" / "attention_probs" / name))


def test_vcr_checkpoint_on_own_images_with_a_grid_skips_an_undecodable_image(inputs, tmp_path, capsys):
    assert run(inputs, tmp_path, inputs["vcr"], "--images", inputs["photos"], "--captions", inputs["captions"],
               "--grid", "2x2", "--raw-only") == 0
    printed = capsys.readouterr().out
    assert "skipped: image '{}'".format(os.path.join(inputs["photos"], "broken.jpg")) in printed
    assert "attention maps of 1 item(s); 1 skipped (image missing or not decodable) of 2" in printed
    assert "final_mlp.*" in printed  # the VCR head, ignored
    with open(tmp_path / "attention_probs" / "one.json") as f:
        record = json.load(f)
    assert record["tokens"][-6:] == ["[IMAGE]", "[REGION 0]", "[REGION 1]", "[REGION 2]", "[REGION 3]", "[END]"]
    assert record["boxes"][1:] == [[0, 0, 19, 15], [20, 0, 39, 15], [0, 16, 19, 31], [20, 16, 39, 31]]

    # The VCR file's VL-BERT weights are the ones used: a model loaded by hand gives the same maps.
    from common.checkpoint.checkpointer import load_checkpoint_file
    state = load_checkpoint_file(inputs["vcr"])["state_dict"]
    from pretrain.task import TASK
    from pretrain.function.vis import build_model
    cfg = TASK.load_config(CFG, _opts(dict(_arch(inputs["bert"]))))
    model, _ = build_model(cfg, inputs["vcr"])
    torch.testing.assert_close(model.vlbert.encoder.layer[0].attention.self.query.weight,
                               state["vlbert._module.encoder.layer.0.attention.self.query.weight"])


@pytest.mark.parametrize("case", ["no_captions", "heads_only", "bad_box_file", "wrong_depth"])
def test_bad_inputs_stop_with_one_error_naming_the_file(inputs, tmp_path, capsys, case):
    args, opts, ckpt = [], {}, inputs["pretrain"]
    if case == "no_captions":
        args = ["--images", inputs["photos"], "--captions", str(tmp_path / "missing.json")]
        named = str(tmp_path / "missing.json")
    elif case == "heads_only":
        ckpt = named = inputs["heads_only"]
    elif case == "bad_box_file":
        box_file = tmp_path / "boxes.json"
        box_file.write_text(json.dumps([{"image_id": 9, "image": "x.jpg", "boxes": [[1, 2, 3]]}]))
        args, named = ["--box-source", "file", "--box-file", str(box_file)], str(box_file)
    else:  # a checkpoint with 2 layers read by a 1-layer config
        opts, named = {"NETWORK.VLBERT.num_hidden_layers": 1}, inputs["pretrain"]
    assert run(inputs, tmp_path / "out", ckpt, "--raw-only", *args, **opts) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and named in error, error
    assert not os.path.exists(tmp_path / "out" / "attention_probs")


def test_boxes_from_extract_features_files(inputs, tmp_path):
    """The 'features' box source reads the boxes of tools/extract_features.py's per-image JSON files."""
    from common.data.region_features import RegionFeatures, feature_json_path, write_feature_json

    folder = tmp_path / "features"
    folder.mkdir()
    boxes = np.array([[2, 3, 20, 25], [10, 0, 39, 31]], dtype=np.float32)
    write_feature_json(feature_json_path(str(folder), "one"), RegionFeatures(
        image_id="one", image_w=40, image_h=32, boxes=boxes, features=np.zeros((2, 8), np.float32)))
    with open(tmp_path / "captions.json", "w") as f:
        json.dump([{"image": "one.jpg", "caption": "a cat"}], f)
    assert run(inputs, tmp_path / "out", inputs["pretrain"], "--images", inputs["photos"], "--captions",
               str(tmp_path / "captions.json"), "--box-source", "features", "--box-file", str(folder),
               "--raw-only") == 0
    with open(tmp_path / "out" / "attention_probs" / "one.json") as f:
        record = json.load(f)
    assert record["boxes"] == [[0, 0, 39, 31]] + boxes.tolist()
    tokens = 4 + 3 + 1  # [CLS] a cat [SEP], the whole image and 2 boxes, [END]
    assert record["tokens"][4:] == ["[IMAGE]", "[REGION 0]", "[REGION 1]", "[END]"]
    assert np.load(tmp_path / "out" / "attention_probs" / "one.npy").shape == (LAYERS, HEADS, tokens, tokens)
