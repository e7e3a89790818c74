"""TRAIN.STRATEGY 'fsdp' (FSDP2 shards, common/parallel/fsdp.py) against 'ddp' through the real launcher
(scripts/dist_run_single.sh, 2 gloo ranks on the CPU) and the tasks' train_end2end.py.

Both strategies compute the same sums in another order (a reduce-scatter then an all-gather instead of an
all-reduce), so losses and weights agree to float32 rounding: within 1e-5.
"""
import glob
import os
import re
import subprocess
import sys

import pytest
import torch

from common.checkpoint.checkpointer import load_checkpoint_file

from tests import tiny_cls, tiny_vqa
from tests import tiny_pretrain as tp
from tests.tiny_vcr import CFG as VCR_CFG, ENTRY as VCR_ENTRY, LAUNCH_ENV, ROOT, output_folder as vcr_output
from tests.tiny_vcr import tensorboard_scalars_in

DIST_RUN = os.path.join(ROOT, "scripts", "dist_run_single.sh")
TOL = 1e-5  # float32 rounding of sums taken in another order
TIE = 1e-3  # relative gap of two logits that weights TOL apart may order either way (far above their change)


def launch(entry, cfg, model_dir, opts, nprocs=2):
    """``scripts/dist_run_single.sh nprocs entry cfg model_dir --opts ...``; fails the test on a non-zero exit."""
    proc = subprocess.run([DIST_RUN, str(nprocs), entry, cfg, str(model_dir), "--opts"] + [str(o) for o in opts],
                          env=dict(os.environ, **LAUNCH_ENV), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def final_checkpoint(folder):
    """The last epoch checkpoint in an output folder (a file, or a sharded folder of an FSDP run), read on the CPU."""
    paths = sorted(p for p in glob.glob(os.path.join(folder, "*-[0-9][0-9][0-9][0-9].model")))
    assert paths, "no epoch checkpoint in {}".format(folder)
    return load_checkpoint_file(paths[-1])


def train_both(tmp_path, entry, cfg, opts, output_of):
    """Run ``opts`` under each strategy; returns ``{strategy: (scalars, final checkpoint)}``."""
    runs = {}
    for strategy in ("ddp", "fsdp"):
        model_dir = tmp_path / strategy
        launch(entry, cfg, model_dir, list(opts) + ["TRAIN.STRATEGY", strategy])
        folder = output_of(model_dir)
        runs[strategy] = tensorboard_scalars_in(folder), final_checkpoint(folder)
    return runs


def assert_same_training(runs, loss_tag="Train-Loss"):
    (ddp_scalars, ddp), (fsdp_scalars, fsdp) = runs["ddp"], runs["fsdp"]
    ddp_loss, fsdp_loss = ddp_scalars[loss_tag], fsdp_scalars[loss_tag]
    assert [s for s, _ in fsdp_loss] == [s for s, _ in ddp_loss] and len(ddp_loss) >= 2
    assert [v for _, v in fsdp_loss] == pytest.approx([v for _, v in ddp_loss], abs=TOL, rel=0)
    for tag in ("Skipped-Steps", "Loss-Scale"):
        assert fsdp_scalars[tag] == ddp_scalars[tag], tag
    assert fsdp["train_state"] == ddp["train_state"]
    assert list(fsdp["state_dict"]) == list(ddp["state_dict"])
    worst = max(float((fsdp["state_dict"][k].double() - v.double()).abs().max()) for k, v in ddp["state_dict"].items()
                if v.is_floating_point() and v.numel())
    assert worst < TOL, worst
    # the optimizer state, gathered from its shards, has the layout of the DDP run's
    assert sorted(fsdp["optimizer"]["state"]) == sorted(ddp["optimizer"]["state"])
    assert fsdp["optimizer"]["param_groups"] == ddp["optimizer"]["param_groups"]
    return ddp_scalars, fsdp_scalars


def assert_same_validation(runs, ties, items):
    """Epoch-end validation (sharded forwards under fsdp, a rank with fewer batches padding) reports the metrics of
    the DDP run: the same tags and steps; an accuracy differs by at most the ``ties`` of ``items`` (see
    :func:`near_tied_items`)."""
    (ddp, _), (fsdp, _) = runs["ddp"], runs["fsdp"]
    tags = sorted(t for t in ddp if t.startswith("Val-"))
    assert tags and tags == sorted(t for t in fsdp if t.startswith("Val-"))
    for tag in tags:
        assert [s for s, _ in fsdp[tag]] == [s for s, _ in ddp[tag]], tag
        assert all(abs(a - b) <= ties / items + 1e-6 for (_, a), (_, b) in zip(fsdp[tag], ddp[tag])), tag


def near_tied_items(ckpt, opts):
    """``(near ties, items)`` of the VCR val set under ``ckpt``: items whose two best answer logits differ by
    at most TIE (relative to the row's largest magnitude), in-process on the CPU."""
    from common.engine import build_loader, load_for_inference
    from common.inference.evaluation import inference_on_dataset
    from tests.evaluators import OutputRows
    from vcr.task import TASK

    cfg = TASK.load_config(VCR_CFG, opts + ["NUM_WORKERS_PER_GPU", "0"])
    model = load_for_inference(TASK, cfg, ckpt, torch.device("cpu"))
    logits = inference_on_dataset(model, build_loader(TASK, cfg, "val"), OutputRows("label_logits"),
                                  TASK.label_index_in_batch(cfg))
    top = logits.topk(2, dim=1).values
    return int(((top[:, 0] - top[:, 1]) <= TIE * logits.abs().amax(1)).sum()), len(logits)


def test_fsdp_equals_ddp_on_vcr_with_accumulation_and_clipping(tmp_path, tiny_vcr):
    """The paper VCR config (ResNet backbone with frozen parts, 2 VL-BERT layers, SGD, clipping at 10), k = 2:
    per-step loss, skipped steps and final weights of 2-rank FSDP = 2-rank DDP."""
    runs = train_both(tmp_path, VCR_ENTRY, VCR_CFG, tiny_vcr.opts(), vcr_output)
    ddp_scalars, _ = assert_same_training(runs)
    assert all(v > 0 for _, v in ddp_scalars["grad-para/Total-Norm"])  # clipping measured a real norm
    # DDP writes files; FSDP a folder per checkpoint with one shard per rank, none left half-written
    ddp_out, fsdp_out = vcr_output(tmp_path / "ddp"), vcr_output(tmp_path / "fsdp")
    best = os.path.join(fsdp_out, "vl-bert_base_a_res101-best.model")
    assert os.path.isfile(os.path.join(ddp_out, "vl-bert_base_a_res101-best.model")) and os.path.isdir(best)
    assert sorted(n for n in os.listdir(best) if n.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not [n for n in os.listdir(fsdp_out) if n.startswith(".")]
    # vcr/val.py reads the folder as the DDP run's file; the consolidated file holds the folder's dict
    accuracy = {}
    for strategy, out in (("ddp", ddp_out), ("fsdp", fsdp_out)):
        val = subprocess.run([sys.executable, os.path.join(ROOT, "vcr", "val.py"), "--cfg", VCR_CFG, "--ckpt",
                              os.path.join(out, "vl-bert_base_a_res101-best.model"), "--opts"] + tiny_vcr.opts(),
                             env=dict(os.environ, **LAUNCH_ENV), capture_output=True, text=True, timeout=300)
        assert val.returncode == 0, val.stderr[-3000:]
        accuracy[strategy] = float(re.search(r"Q->A accuracy on val: ([0-9.]+)", val.stdout).group(1))
    # The weights agree within TOL, not bit for bit: an item whose two best answers nearly tie (within TIE of the
    # DDP model's logits) may be answered either way; the accuracies (4 decimals) differ by at most those items.
    ties, items = near_tied_items(os.path.join(ddp_out, "vl-bert_base_a_res101-best.model"), tiny_vcr.opts())
    assert abs(accuracy["fsdp"] - accuracy["ddp"]) <= ties / items + 1e-4, (accuracy, ties, items)
    assert_same_validation(runs, ties, items)  # 1 val item: rank 1 pads with a batch of it
    single = str(tmp_path / "consolidated.model")
    tool = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "consolidate_checkpoint.py"), best, single],
                          capture_output=True, text=True, timeout=300)
    assert tool.returncode == 0, tool.stderr[-3000:]
    consolidated = torch.load(single, map_location="cpu", weights_only=True)
    assert sorted(consolidated) == sorted(load_checkpoint_file(best))
    assert all(torch.equal(v, runs["fsdp"][1]["state_dict"][k]) for k, v in consolidated["state_dict"].items())


@pytest.mark.slow
def test_fsdp_equals_ddp_on_vcr_in_fp16_with_adamw_bf16_state_and_ema(tmp_path, tiny_vcr):
    """fp16 with a dynamic loss scale from 2**24 (the first steps overflow and are skipped, the same ones under
    both strategies), AdamW with bfloat16 moments, EMA and gradient checkpointing."""
    opts = tiny_vcr.opts({"TRAIN.FP16": True, "TRAIN.FP16_LOSS_SCALE": "dynamic", "TRAIN.OPTIMIZER": "AdamW",
                          "TRAIN.OPTIM_STATE_DTYPE": "bfloat16", "TRAIN.EMA_DECAY": 0.9,
                          "NETWORK.GRADIENT_CHECKPOINTING": True, "TRAIN.LR": 1e-5})
    runs = train_both(tmp_path, VCR_ENTRY, VCR_CFG, opts, vcr_output)
    ddp_scalars, _ = assert_same_training(runs)
    ema = {s: torch.load(glob.glob(os.path.join(vcr_output(tmp_path / s), "*-ema.model"))[0], weights_only=True)
           for s in ("ddp", "fsdp")}
    assert max(float((ema["fsdp"]["state_dict"][k] - v).abs().max()) for k, v in ema["ddp"]["state_dict"].items()
               if v.is_floating_point()) < TOL


@pytest.mark.slow
def test_fsdp_starts_from_the_weights_of_a_ddp_run_of_the_same_seed(tmp_path, tiny_vcr):
    """Under fsdp the model is built on the meta device and filled one shard group at a time
    (common/parallel/meta_init.py): random initialisation, the BERT and ResNet files, the EMA copy, then
    NETWORK.PARTIAL_PRETRAIN (the first ddp run's checkpoint). With TRAIN.LR 0 the checkpoints hold the start: equal
    to the ddp run's bit for bit (the same draws of the same generator state, the same file values). Dropout is on
    (the paper config's 0.1): each rank's generator after the build is where the ordinary build leaves it, so the
    losses (the dropout masks) are ddp's."""
    opts = tiny_vcr.opts({"TRAIN.LR": 0.0, "TRAIN.EMA_DECAY": 0.9})
    first = os.path.join(vcr_output(tmp_path / "random" / "ddp"), "vl-bert_base_a_res101-0000.model")
    for name, extra in (("random", []), ("pretrained", ["NETWORK.PARTIAL_PRETRAIN", first,
                                                        "NETWORK.PARTIAL_PRETRAIN_SEGMB_INIT", False])):
        runs = train_both(tmp_path / name, VCR_ENTRY, VCR_CFG, opts + extra, vcr_output)
        assert_same_training(runs)
        (_, ddp), (_, fsdp) = runs["ddp"], runs["fsdp"]
        assert all(torch.equal(fsdp["state_dict"][k], v) for k, v in ddp["state_dict"].items()), name
        ema = {s: torch.load(glob.glob(os.path.join(vcr_output(tmp_path / name / s), "*-ema.model"))[0],
                             weights_only=True) for s in ("ddp", "fsdp")}
        assert all(torch.equal(ema["fsdp"]["state_dict"][k], v) for k, v in ema["ddp"]["state_dict"].items()), name


@pytest.mark.slow
def test_fsdp_equals_ddp_on_vqa(tmp_path_factory, tmp_path):
    inputs = tiny_vqa.make_inputs(tmp_path_factory.mktemp("tiny_vqa"))
    name = "base_4x16G_fp32"
    runs = train_both(tmp_path, os.path.join(ROOT, "vqa", "train_end2end.py"), tiny_vqa.CFGS[name], inputs.opts(),
                      lambda model_dir: tiny_vqa.output_folder(model_dir, name))
    assert_same_training(runs)


@pytest.mark.slow
def test_fsdp_equals_ddp_on_pretraining(tmp_path, tiny_pretrain):
    name = "base_e2e_16x16G_fp16.yaml"
    runs = train_both(tmp_path, tp.ENTRY, tp.cfg_path(name), tp.opts(name, tiny_pretrain),
                      lambda model_dir: tp.output_folder(model_dir, name))
    assert_same_training(runs)


@pytest.mark.slow
def test_fsdp_equals_ddp_on_cls_vit(tmp_path):
    """The cls task's timm ViT: its blocks and the ViT are shard groups."""
    import demo.make_cls_demo_data as make_cls_demo_data

    data = make_cls_demo_data.write(str(tmp_path / "data"), train=40, test=8)  # 5 steps of 8 images
    name = "vit_base16_cifar100_1x24G_bf16"
    opts = tiny_cls.opts(data, name) + ["TRAIN.FP16", "false", "LOG_FREQUENT", "1"]
    runs = train_both(tmp_path, os.path.join(ROOT, "cls", "train_end2end.py"),
                      os.path.join(ROOT, "cfgs", "cls", name + ".yaml"), opts,
                      lambda model_dir: glob.glob(str(model_dir / "output" / "cls" / name / "train_train"))[0])
    assert_same_training(runs)


def test_fsdp_equals_ddp_on_vcr_with_the_vit_image_encoder(tmp_path, tiny_vcr):
    """VL-BERT with NETWORK.IMAGE_ENCODER 'vit': the ViT runs once per distinct image size of a rank's batch, so a
    different number of times on each rank (tiny_vcr's two orientations); each block is a shard group, every rank
    entering it once per image size of any rank's batch."""
    from tests.test_vit_end2end import vit_opts

    # 11 val items in batches of 5: rank 0 runs 2 batches, rank 1 one and a padding batch
    opts = tiny_vcr.opts({"DATASET.VAL_ANNOTATION_FILE": "val_real.jsonl", "VAL.BATCH_IMAGES": 5}) + vit_opts("vcr")
    runs = train_both(tmp_path, VCR_ENTRY, VCR_CFG, opts, vcr_output)
    assert_same_training(runs)
    ties, items = near_tied_items(os.path.join(vcr_output(tmp_path / "ddp"), "vl-bert_base_a_res101-0000.model"),
                                  opts)
    assert items == 11 and ties < items
    assert_same_validation(runs, ties, items)
    assert any(k.startswith("image_feature_extractor.vit.blocks.") for k in runs["fsdp"][1]["state_dict"])
    from common.engine import build_model
    from common.parallel.fsdp import shard_groups
    from vcr.task import TASK

    groups = [name for name, _ in shard_groups(build_model(TASK, TASK.load_config(VCR_CFG, opts)))]
    assert groups == ["image_feature_extractor.vit.blocks.{}".format(i) for i in range(4)] + [
        "vlbert._module.encoder.layer.0", "vlbert._module.encoder.layer.1", "image_feature_extractor", ""], groups


def test_a_parameter_with_fewer_rows_than_ranks_is_sharded_on_its_longest_dimension_the_ranks_divide():
    from torch.distributed.tensor import Shard
    from common.parallel.fsdp import shard_placement
    assert shard_placement(torch.empty(1, 197, 768), 64) == Shard(2)  # ViT-B/16's position embedding
    assert shard_placement(torch.empty(2, 512), 4) == Shard(1)
    assert shard_placement(torch.empty(2, 512), 2) is None  # as many rows as ranks: dim 0
    assert shard_placement(torch.empty(1, 6, 5), 3) == Shard(1)  # 5 is longer, 3 does not divide it
    assert shard_placement(torch.empty(1, 7), 3) is None  # no dimension 3 divides: dim 0
    assert shard_placement(torch.empty(2), 4) is None
