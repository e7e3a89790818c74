"""The cls task: CIFAR pickles (a hostile one refused), ImageFolder, the demo data generator, the
per-sample augmentation, and each shipped cls config trained 2 steps at tiny size through
``cls/train_end2end.py``, then ``cls/val.py`` and ``cls/test.py`` on its checkpoint."""
import csv
import glob
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from common.data.samplers import SampleKey
from common.fileio.safe_load import UnreadableFileError
from tests.conftest import ROOT, slow_cases
from tests.tiny_cls import TINY_VIT, opts as tiny_opts
from tests.tiny_vcr import run_script, tensorboard_scalars_in

sys.path.insert(0, os.path.join(ROOT, "demo"))
import make_cls_demo_data  # noqa: E402
from cls.data.augment import build_augment, erasing_probability  # noqa: E402
from cls.data.datasets import CIFAR10, CIFAR100, ImageFolder  # noqa: E402
from cls.task import TASK  # noqa: E402


def _eval_cfg(**opts):
    pairs = ["NETWORK.PIXEL_MEANS", "[0.0, 0.0, 0.0]", "NETWORK.PIXEL_STDS", "[255.0, 255.0, 255.0]"]
    for key, value in opts.items():
        pairs += [key.replace("__", "."), str(value)]
    return TASK.load_config(None, pairs)


def _write_cifar100(folder, train, test):
    """CIFAR-100's files: ``train`` / ``test`` batches of uint8 [N, 3072] and ``meta`` (protocol 2)."""
    os.makedirs(folder, exist_ok=True)
    for name, (data, labels) in (("train", train), ("test", test)):
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump({b"data": data, b"fine_labels": labels, b"coarse_labels": [0] * len(labels),
                         b"filenames": [b"x.png"] * len(labels)}, f, protocol=2)
    with open(os.path.join(folder, "meta"), "wb") as f:
        pickle.dump({b"fine_label_names": [b"apple", b"bee", b"cloud"], b"coarse_label_names": [b"all"]}, f,
                    protocol=2)


def test_cifar100_pickles_read_as_images_and_labels(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
    _write_cifar100(str(tmp_path), (data, [2, 0, 1]), (data[:1], [1]))
    cfg = _eval_cfg(DATASET__IMAGE_SIZE=32)
    train = CIFAR100(str(tmp_path), "train", build_augment(cfg, "val"))
    assert train.classes == ["apple", "bee", "cloud"]
    assert train.labels.tolist() == [2, 0, 1]
    image, label, index = train[1]
    # R, G, B planes of 32 x 32 in the file; the image is those planes / 255 (mean 0, std 255 above).
    expected = torch.from_numpy(data[1].reshape(3, 32, 32).astype(np.float32) / 255)
    assert torch.allclose(image, expected, atol=1e-6)
    assert (int(label), int(index)) == (0, 1)
    assert len(CIFAR100(str(tmp_path), "test", build_augment(cfg, "val"))) == 1


def test_a_cifar_pickle_that_asks_to_run_code_is_refused_by_name(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch {}".format(tmp_path / "ran"),))

    _write_cifar100(str(tmp_path), (np.zeros((1, 3072), np.uint8), [0]), (np.zeros((1, 3072), np.uint8), [0]))
    with open(tmp_path / "train", "wb") as f:
        pickle.dump({b"data": Payload(), b"fine_labels": [0]}, f, protocol=2)
    with pytest.raises(UnreadableFileError, match=r"train was refused.*asks to call (posix|os)\.system"):
        CIFAR100(str(tmp_path), "train", None)
    assert not (tmp_path / "ran").exists()
    # An array of Python objects would unpickle its items through the array's state: refused too.
    with open(tmp_path / "train", "wb") as f:
        pickle.dump({b"data": np.array([1, "x"], dtype=object), b"fine_labels": [0]}, f, protocol=2)
    with pytest.raises(UnreadableFileError, match=r"numpy\.dtype\('O8'\) \(an array of Python objects\)"):
        CIFAR100(str(tmp_path), "train", None)


def test_imagefolder_reads_classes_in_sorted_folder_order(tmp_path):
    pixels = {}
    for cls_name, value in (("dog", 200), ("cat", 10), ("cat", 30)):
        folder = tmp_path / "train" / cls_name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "{}.png".format(value)
        Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)
        pixels[value] = path
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    dataset = ImageFolder(str(tmp_path), "train", build_augment(_eval_cfg(DATASET__IMAGE_SIZE=8), "val"))
    assert dataset.classes == ["cat", "dog"]
    assert dataset.labels.tolist() == [0, 0, 1]
    values = [round(float(dataset[i][0].mean()) * 255) for i in range(3)]
    assert values == [10, 30, 200]


def test_demo_generator_is_deterministic_and_balanced(tmp_path):
    a = make_cls_demo_data.write(str(tmp_path / "a"), seed=0, train=20, test=10)
    b = make_cls_demo_data.write(str(tmp_path / "b"), seed=0, train=20, test=10)
    c = make_cls_demo_data.write(str(tmp_path / "c"), seed=1, train=20, test=10)
    names = sorted(os.listdir(a))
    assert names == ["batches.meta"] + ["data_batch_{}".format(i) for i in range(1, 6)] + ["test_batch"]
    for name in names:
        assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read()
    assert open(os.path.join(a, "test_batch"), "rb").read() != open(os.path.join(c, "test_batch"), "rb").read()
    test = CIFAR10(a, "test", None)
    assert test.labels.tolist() == list(range(10))
    assert test.classes[0] == "pinwheel2" and test.classes[9] == "rings4"
    assert len(CIFAR10(a, "train", None)) == 20


def test_augmentation_depends_on_the_sample_key_only():
    cfg = TASK.load_config(None, ["DATASET.IMAGE_SIZE", "16", "TRAIN.RRC_SCALE", "[0.8, 1.0]", "TRAIN.TRIVIAL_AUGMENT",
                                  "true", "TRAIN.RANDOM_ERASING_PROB", "[1.0, 0.0]", "TRAIN.END_EPOCH", "3"])
    augment = build_augment(cfg, "train")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    first = augment(image, SampleKey(3, 0, 7).generator(), 0)
    torch.rand(5)  # the global RNG moves: no effect on a keyed sample
    assert torch.equal(first, augment(image, SampleKey(3, 0, 7).generator(), 0))
    assert not torch.equal(first, augment(image, SampleKey(3, 1, 7).generator(), 1))
    assert [erasing_probability(0.4, 0.2, e, 11) for e in (0, 5, 10, 12)] == pytest.approx([0.4, 0.3, 0.2, 0.2])


# Slow: the bf16 twin of the fp16 paper config (the same ViT-B; bf16 autocast runs in the default suite elsewhere).
@pytest.mark.parametrize("cfg_name", slow_cases(["vit_base16_cifar100_1x24G_fp16", "vit_base16_cifar100_1x24G_bf16",
                                                 "demo_cpu"], ["vit_base16_cifar100_1x24G_bf16"]))
def test_shipped_config_trains_two_steps_then_validates_and_tests(tmp_path, cfg_name):
    data = make_cls_demo_data.write(str(tmp_path / "data"), train=15, test=10)
    cfg = os.path.join(ROOT, "cfgs", "cls", cfg_name + ".yaml")
    opts = tiny_opts(data, cfg_name)
    # 15 training images, 8 per step: 2 optimizer steps (the second on 7 images).
    code = run_script(os.path.join(ROOT, "cls", "train_end2end.py"),
                      ["--cfg", cfg, "--model-dir", str(tmp_path), "--opts"] + opts)
    assert code in (0, None)
    out = glob.glob(str(tmp_path / "output" / "cls" / cfg_name / "train_train"))[0]
    ckpt_path = glob.glob(os.path.join(out, "*-0000.model"))[0]
    state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert state["train_state"]["global_step"] == 2
    scalars = tensorboard_scalars_in(out)
    assert {"Val-Acc", "Val-Top5Acc", "Val-Loss"} <= set(scalars)
    assert scalars["Val-Top5Acc"][0][1] >= scalars["Val-Acc"][0][1]
    head = [k for k in state["state_dict"] if k.endswith("backbone.head.weight")]
    assert head and state["state_dict"][head[0]].shape == (10, 24)

    val = subprocess.run([sys.executable, os.path.join(ROOT, "cls", "val.py"), "--cfg", cfg, "--ckpt", ckpt_path,
                          "--opts"] + opts, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert val.returncode == 0, val.stderr
    assert "cls test: top-1 " in val.stdout and "(10 images)" in val.stdout
    test = subprocess.run([sys.executable, os.path.join(ROOT, "cls", "test.py"), "--cfg", cfg, "--ckpt", ckpt_path,
                           "--result-path", str(tmp_path / "res"), "--opts"] + opts, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert test.returncode == 0, test.stderr
    with open(test.stdout.strip().splitlines()[-1]) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["index", "label", "predicted", "top5"]
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(10)]
    assert [r[1] for r in rows[1:]] == make_cls_demo_data.NAMES
    assert all(len(r[3].split("|")) == 5 and r[3].split("|")[0] == r[2] for r in rows[1:])


def test_image_pretrained_timm_weights_load_except_a_head_of_another_class_count(tmp_path):
    import timm
    from safetensors.torch import save_file

    from common.modeling.module import RandomInitWarning

    kwargs = dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=2)
    source = timm.create_model("vit_tiny_patch16_224", num_classes=5, **kwargs).state_dict()
    save_file(source, str(tmp_path / "w.safetensors"))
    torch.save(source, str(tmp_path / "w.pth"))
    for name in ("w.safetensors", "w.pth"):
        cfg = TASK.load_config(None, TINY_VIT + ["NETWORK.NUM_CLASSES", "10", "NETWORK.IMAGE_PRETRAINED",
                                                str(tmp_path / name)])
        with pytest.warns(RandomInitWarning, match=r"head\.(weight|bias), head\.(weight|bias) stay random"):
            model = TASK.build_model(cfg)
        loaded = model.backbone.state_dict()
        assert torch.equal(loaded["blocks.0.attn.qkv.weight"], source["blocks.0.attn.qkv.weight"])
        assert loaded["head.weight"].shape == (10, 24)

    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    torch.save({"blocks.0.attn.qkv.weight": Payload()}, str(tmp_path / "bad.pth"), _use_new_zipfile_serialization=True)
    cfg = TASK.load_config(None, TINY_VIT + ["NETWORK.IMAGE_PRETRAINED", str(tmp_path / "bad.pth")])
    with pytest.raises(UnreadableFileError, match="NETWORK.IMAGE_PRETRAINED weights.*(posix|os).system"):
        TASK.build_model(cfg)
