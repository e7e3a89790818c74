"""Pretraining through ``pretrain/train_end2end.py`` at tiny size (tests/tiny_pretrain.py): every shipped
training config, the metrics and losses in the log and TensorBoard, exact resume after SIGKILL, and
fine-tuning VCR from the pretraining checkpoint through NETWORK.PARTIAL_PRETRAIN."""
import dataclasses
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from tests import tiny_pretrain as tp
from tests import tiny_vcr as vcr
from tests.conftest import slow_cases

# Metrics and loss loggers each config logs (the reference's names).
MULTITASK_METRICS = ["MLMAccWVC", "MLMAccAUX", "MVRCAccuracy", "MLMLossWVC", "MLMLossAUX", "MVRCLoss"]
SINGLE_METRICS = ["MLMAcc", "MVRCAccuracy", "MLMLossWVC", "MVRCLoss"]  # (the config names mlm_loss so)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


# Slow: large_e2e, the large twin of base_e2e (the same end-to-end path with the ResNet trained).
@pytest.mark.parametrize("name", slow_cases(tp.CONFIGS, ["large_e2e_16x16G_fp16.yaml"]))
def test_every_shipped_config_trains_through_the_entry_point(tmp_path, tiny_pretrain, name):
    assert tp.train(tmp_path, name, tp.opts(name, tiny_pretrain)) == 0
    ckpt = load(tp.checkpoint_path(tmp_path, name, 0))
    # the first data set defines the epoch: 15 training captions in batches of 2, k micro-batches a step
    k = tp.shipped(name, "TRAIN").get("GRAD_ACCUMULATE_STEPS", 1)
    assert ckpt["train_state"]["global_step"] == 8 // k and ckpt["train_state"]["epoch"] == 1
    log = vcr.log_text_in(tp.output_folder(tmp_path, name))
    metrics = SINGLE_METRICS if "withouttextonly" in name else MULTITASK_METRICS
    train_line = re.findall(r"Epoch\[0\] Batch \[7\].*", log)[-1]
    assert re.findall(r"(?:Train-)?(\w+)=[-\d.na]+", train_line) == metrics
    val_line = re.findall(r"Epoch\[0\] \tVal-.*", log)[-1]
    assert re.findall(r"(?:Val-)?(\w+)=[-\d.na]+", val_line) == metrics
    host = "MLMAcc" if "withouttextonly" in name else "MLMAccWVC"
    assert "Best Val {}:".format(host) in log
    scalars = vcr.tensorboard_scalars_in(tp.output_folder(tmp_path, name))
    for metric in metrics:
        assert [x for x, _ in scalars["Train-" + metric]] == list(range(k - 1, 8, k)), metric
    losses = [v for _, v in scalars["Train-" + metrics[-1]]]
    assert all(v >= 0 for v in losses)


@pytest.fixture(scope="module")
def vcr_pretrained(tmp_path_factory, tiny_pretrain, tiny_vcr):
    """A tiny e2e pretraining run (paper config base_e2e) on the VCR tiny BERT and ResNet, so that its
    checkpoint fits the tiny VCR model; returns the checkpoint path."""
    inputs = dataclasses.replace(tiny_pretrain, bert=tiny_vcr.bert, resnet=tiny_vcr.resnet,
                                 vocab_size=tiny_vcr.vocab_size)
    model_dir = tmp_path_factory.mktemp("pretrain_for_vcr")
    name = "base_e2e_16x16G_fp16.yaml"
    assert tp.train(model_dir, name, tp.opts(name, inputs)) == 0
    return tp.checkpoint_path(model_dir, name, 0)


def renamed_by_vcr_rules(key):
    """The VCR paper config's PARTIAL_PRETRAIN_PREFIX_CHANGES on a key of our checkpoints (no ``module.``)."""
    if key.startswith("vlbert.mvrc_head.transform"):
        return "cnn_loss_reg.0" + key[len("vlbert.mvrc_head.transform"):]
    if key.startswith("vlbert."):
        return "vlbert._module." + key[len("vlbert."):]
    return key


def test_pretrain_checkpoint_fine_tunes_vcr_through_partial_pretrain(tmp_path, tiny_vcr, vcr_pretrained):
    assert tiny_vcr_train(tmp_path, tiny_vcr, vcr_pretrained) == 0
    source = {renamed_by_vcr_rules(k): v for k, v in load(vcr_pretrained)["state_dict"].items()}
    got = vcr.checkpoint(tmp_path, 0)["state_dict"]
    loaded = sorted(set(source) & set(got))
    left = sorted(set(got) - set(source))
    unmatched = sorted(set(source) - set(got))
    log = vcr.log_text(tmp_path)
    m = re.search(r"\[Partial Load\] \S+: (\d+) keys loaded, (\d+) keys of the file not matched, "
                  r"(\d+) model keys left at init", log)
    assert tuple(int(x) for x in m.groups()) == (len(loaded), len(unmatched), len(left))
    # everything but VCR's own heads and the pooler (with_pooler false in pretraining) comes from the file
    assert left == ["cnn_loss_reg.2.bias", "cnn_loss_reg.2.weight", "final_mlp.1.bias", "final_mlp.1.weight",
                    "vlbert._module.pooler.dense.bias", "vlbert._module.pooler.dense.weight"]
    assert len(loaded) == len(got) - len(left) and len(loaded) > 100
    assert {k.split(".predictions")[0].split(".region_cls")[0] for k in unmatched} == {
        "aux_text_visual_embedding.weight", "object_mask_word_embedding.weight", "vlbert._module.mlm_head",
        "vlbert._module.mvrc_head"}
    tte = "vlbert._module.token_type_embeddings.weight"
    for k in loaded:  # LR 0: the weights are the pretrained ones (segment 1 from segment 0: SEGMB_INIT)
        expected = source[k] if k != tte else torch.cat([source[k][:1], source[k][:1], source[k][2:]])
        assert torch.equal(got[k], expected.to(got[k].dtype)), k


def tiny_vcr_train(model_dir, inputs, pretrained):
    return vcr.train_in_process(model_dir, inputs.opts(TRAIN__LR=0.0, NETWORK__PARTIAL_PRETRAIN=pretrained))


# --------------------------------------------------------------------------------------------- #
# Exact resume of the multi-task loader
# --------------------------------------------------------------------------------------------- #
RESUME_CFG = "base_prec_4x16G_fp32.yaml"


def resume_opts(inputs):
    # corpus batches of 12: 5 per corpus epoch against 8 caption batches, so the corpus loader changes
    # epoch inside caption epochs; a checkpoint every 3 steps; dropout on
    return tp.opts(RESUME_CFG, inputs, {"TRAIN.BATCH_IMAGES": [2, 12], "TRAIN.END_EPOCH": 2,
                                        "TRAIN.CHECKPOINT_STEPS": 3})


def launch(model_dir, opts, env=None):
    cmd = [sys.executable, os.path.join(tp.ROOT, "tests", "fault_injection.py"), "--cfg", tp.cfg_path(RESUME_CFG),
           "--model-dir", str(model_dir), "--opts"] + opts
    out = subprocess.run(cmd, env=dict(os.environ, **vcr.LAUNCH_ENV, FAULT_ENTRY=tp.ENTRY, **(env or {})),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return out.returncode, out.stdout


def test_sigkill_and_resume_restores_every_loaders_position(tmp_path, tiny_pretrain):
    opts = resume_opts(tiny_pretrain)
    rc, out = launch(tmp_path / "clean", opts)
    assert rc == 0, out[-3000:]
    rc, out = launch(tmp_path / "killed", opts, {"FAULT_KILL_AFTER_STEP": "11"})
    assert rc == -signal.SIGKILL, out[-3000:]
    rc, out = launch(tmp_path / "killed", opts)
    assert rc == 0, out[-3000:]
    assert re.search(r"Resumed from \S+-0001-b0000001\.model: epoch 1, batch 1, optimizer step 9", out), out[-3000:]
    a = load(tp.checkpoint_path(tmp_path / "killed", RESUME_CFG, 1))
    b = load(tp.checkpoint_path(tmp_path / "clean", RESUME_CFG, 1))
    assert a["train_state"] == b["train_state"] and a["train_state"]["global_step"] == 16
    for k in b["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    for i, state in b["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(a["optimizer"]["state"][i][name]), torch.as_tensor(value)), (i, name)


def test_world_size_change_mid_epoch_is_refused_with_one_error_line(tmp_path, tiny_pretrain, capsys):
    """The multi-task loader cannot re-shard an epoch: a mid-epoch checkpoint of 2 processes resumed on 1
    stops with one error line naming both world sizes and the way out, before training."""
    opts = tp.opts(RESUME_CFG, tiny_pretrain, {"TRAIN.CHECKPOINT_STEPS": 3})
    assert tp.train(tmp_path, RESUME_CFG, opts) == 0
    folder = tp.output_folder(tmp_path, RESUME_CFG)
    os.remove(tp.checkpoint_path(tmp_path, RESUME_CFG, 0))  # the run stopped at batch 6 of epoch 0
    mid = os.path.join(folder, "{}-0000-b0000006.model".format(tp.shipped(RESUME_CFG, "MODEL_PREFIX")))
    ckpt = load(mid)
    assert ckpt["train_state"]["world_size"] == 1 and ckpt["train_state"]["epoch_batch"] == 6
    ckpt["train_state"]["world_size"] = 2  # as written by 2 processes
    torch.save(ckpt, mid)
    capsys.readouterr()
    assert tp.train(tmp_path, RESUME_CFG, opts) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "written by 2 process(es), this run has 1" in errors[0], errors
    assert "resume on 2 process(es)" in errors[0] and "TRAIN.BEGIN_EPOCH 0" in errors[0], errors
