import collections
import functools
import os
import random
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from common import amp
from common.checkpoint import checkpointer as ck
from common.checkpoint import rng
from common.checkpoint.partial_pretrain import load_partial_pretrain
from common.checkpoint.train_state import check_train_state, new_train_state
from common.hooks.base import TrainContext
from common.hooks.checkpoint import Checkpoint, StepCheckpoint, checkpoint_hooks
from vcr.modules.resnet_vlbert_for_vcr import pretrain_renames


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.norm(self.body(x)))


def _trained(seed=0):
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 4], gamma=0.5)
    for _ in range(3):
        net(torch.randn(5, 3)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return net, opt, sched


class Monitor:
    def __init__(self, best_epoch=-1, best_val=-1.0):
        self.best_epoch, self.best_val = best_epoch, best_val

    def state_dict(self):
        return {"best_epoch": self.best_epoch, "best_val": self.best_val}

    def load_state_dict(self, s):
        self.best_epoch, self.best_val = s["best_epoch"], s["best_val"]


def _equal_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].float(), sb[k].float()) for k in sa)


def test_names():
    assert ck.epoch_checkpoint_path("out/vl-bert", 7) == "out/vl-bert-0007.model"
    assert ck.best_checkpoint_path("out/vl-bert") == "out/vl-bert-best.model"
    assert ck.step_checkpoint_path("out/vl-bert", 2, 150) == "out/vl-bert-0002-b0000150.model"


def test_full_round_trip_weights_only(tmp_path):
    net, opt, sched = _trained()
    scaler = amp.LossScaler("dynamic", min_loss_scale=128.)
    scaler.scale, scaler.unskipped = 512., 17
    state = new_train_state(epoch=1, epoch_batch=6, global_step=9, skipped_steps=1)
    path = str(tmp_path / "m-0000.model")
    ck.save_checkpoint(path, net, opt, validation_monitor=Monitor(0, 0.5), scaler=scaler, lr_scheduler=sched,
                       train_state=state, config={"TRAIN": {"LR": 0.1}})
    raw = torch.load(path, weights_only=True, map_location="cpu")  # safe load as the reference keys
    assert list(raw)[:3] == ["state_dict", "optimizer", "validation_monitor"]
    assert {"amp", "lr_scheduler", "rng", "train_state", "config"} <= set(raw)
    assert "LR: 0.1" in raw["config"]
    assert not any(k.startswith("module.") for k in raw["state_dict"])

    net2, opt2, sched2 = _trained(seed=1)
    scaler2, mon2 = amp.LossScaler("dynamic"), Monitor()
    ckpt = ck.load_checkpoint_file(path)
    restored = ck.restore_checkpoint(ckpt, net2, opt2, scaler2, sched2, mon2)
    assert restored == ["state_dict", "optimizer", "amp", "lr_scheduler", "validation_monitor", "rng"]
    assert _equal_state(net, net2)
    assert opt2.state_dict()["state"][0]["momentum_buffer"].equal(opt.state_dict()["state"][0]["momentum_buffer"])
    assert sched2.state_dict() == sched.state_dict() and isinstance(sched2.milestones, collections.Counter)
    assert (scaler2.scale, scaler2.unskipped) == (512., 17)
    assert (mon2.best_epoch, mon2.best_val) == (0, 0.5)
    s = check_train_state(ckpt["train_state"])
    assert (s["epoch"], s["epoch_batch"], s["global_step"], s["skipped_steps"]) == (1, 6, 9, 1)


def test_checkpointer_saves_and_resumes_every_part(tmp_path):
    net, opt, sched = _trained()
    scaler = amp.LossScaler("dynamic", min_loss_scale=128.)
    scaler.scale = 256.
    prefix = str(tmp_path / "vl")
    saver = ck.Checkpointer(nn.DataParallel(net), opt, prefix, config="A: 1\n", scaler=scaler, lr_scheduler=sched,
                            validation_monitor=Monitor(2, 0.75))
    saver.save(ck.epoch_checkpoint_path(prefix, 2), new_train_state(epoch=3, global_step=12))
    raw = ck.load_checkpoint_file(ck.epoch_checkpoint_path(prefix, 2))
    assert list(raw) == ["state_dict", "optimizer", "validation_monitor", "amp", "lr_scheduler", "train_state", "rng",
                         "config"]

    net2, opt2, sched2 = _trained(seed=1)
    loader = ck.Checkpointer(net2, opt2, prefix, scaler=amp.LossScaler("dynamic"), lr_scheduler=sched2,
                             validation_monitor=Monitor())
    cfg = types.SimpleNamespace(RESUME=False, AUTO_RESUME=True, BEGIN_EPOCH=0, END_EPOCH=5)
    info = loader.resume(cfg)
    assert info.restored == ["state_dict", "optimizer", "amp", "lr_scheduler", "validation_monitor", "rng"]
    assert (info.state["epoch"], info.state["global_step"]) == (3, 12)
    assert _equal_state(net, net2) and sched2.state_dict() == sched.state_dict()
    assert loader.scaler.scale == 256. and loader.validation_monitor.best_val == 0.75


def test_model_saved_fp32_from_half_model(tmp_path):
    net = Net().half()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ckpt = ck.make_checkpoint(net, opt)
    assert all(v.dtype == torch.float32 for k, v in ckpt["state_dict"].items() if "num_batches" not in k)
    assert ckpt["state_dict"]["norm.num_batches_tracked"].dtype == torch.int64


def test_reference_style_fp16_module_checkpoint_loads(tmp_path):
    ref, _, _ = _trained()
    sd = collections.OrderedDict(("module." + k, v.half() if v.is_floating_point() else v)
                                 for k, v in ref.state_dict().items())
    opt_state = torch.optim.SGD(ref.parameters(), lr=0.1).state_dict()
    path = str(tmp_path / "vl-bert_base_res101_vcr-0005.model")
    torch.save({"state_dict": sd, "optimizer": opt_state,
                "validation_monitor": {"best_epoch": 4, "best_val": torch.tensor(0.7)}}, path)

    net = Net()
    ckpt = ck.load_checkpoint_file(path)
    ck.load_model_state_dict(net, ckpt["state_dict"], path)
    for k, v in net.state_dict().items():
        assert v.dtype == ref.state_dict()[k].dtype
        assert torch.equal(v, sd["module." + k].to(v.dtype))
    # and into a wrapped model, whose own keys carry module.
    wrapped = nn.DataParallel(Net())
    ck.load_model_state_dict(wrapped, ckpt["state_dict"], path)
    assert torch.equal(wrapped.module.body.weight, net.body.weight)
    # our checkpoint (no module.) into a wrapped model
    ck.load_model_state_dict(wrapped, ck.make_checkpoint(net, torch.optim.SGD(net.parameters(), lr=1))["state_dict"])


def test_resume_from_reference_checkpoint(tmp_path):
    ref, opt, _ = _trained()
    prefix = str(tmp_path / "vcr")
    torch.save({"state_dict": {"module." + k: v for k, v in ref.state_dict().items()},
                "optimizer": opt.state_dict(), "validation_monitor": {"best_epoch": 1, "best_val": 0.6}},
               ck.epoch_checkpoint_path(prefix, 1))
    cfg = types.SimpleNamespace(RESUME=False, AUTO_RESUME=True, BEGIN_EPOCH=0, END_EPOCH=5)
    net, opt2, _ = _trained(seed=3)
    mon = Monitor()
    info = ck.resume_training(prefix, cfg, net, opt2, validation_monitor=mon, steps_per_epoch=10)
    assert info.path == ck.epoch_checkpoint_path(prefix, 1)
    assert (info.state["epoch"], info.state["epoch_batch"], info.state["global_step"]) == (2, 0, 20)
    assert info.restored == ["state_dict", "optimizer", "validation_monitor"]
    assert _equal_state(ref, net) and mon.best_epoch == 1


def test_mismatch_lists_keys():
    net = Net()
    sd = {k: v for k, v in net.state_dict().items() if not k.startswith("head.")}
    sd["extra.weight"] = torch.zeros(1)
    sd["body.weight"] = torch.zeros(5, 3)
    with pytest.raises(ck.CheckpointError) as e:
        ck.load_model_state_dict(Net(), sd, "some.model")
    msg = str(e.value)
    assert "some.model" in msg and "head.weight" in msg and "head.bias" in msg
    assert "extra.weight" in msg and "body.weight: (5, 3) in checkpoint, (4, 3) in model" in msg


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_not_a_checkpoint_names_file(tmp_path):
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"this is not a checkpoint")
    with pytest.raises(ck.CheckpointError, match="junk.model is not a readable checkpoint"):
        ck.load_checkpoint_file(str(junk))
    weights = tmp_path / "weights.pth"
    torch.save(Net().state_dict(), str(weights))
    with pytest.raises(ck.CheckpointError, match="weights.pth is not a checkpoint.*'state_dict'"):
        ck.load_checkpoint_file(str(weights))
    evil = tmp_path / "evil.model"
    torch.save({"state_dict": {}, "x": Evil()}, str(evil))
    with pytest.raises(ck.CheckpointError, match=r"evil.model was refused \(checkpoint\): it asks to call posix.system"):
        ck.load_checkpoint_file(str(evil))
    with pytest.raises(FileNotFoundError, match="absent.model"):
        ck.load_checkpoint_file(str(tmp_path / "absent.model"))


def test_rng_round_trip():
    state = rng.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(2), np.random.randn())
    rng.set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(2), np.random.randn())
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2]) and a[3] == b[3]


def test_write_checkpoint_file_keeps_old_file_on_crash(tmp_path, monkeypatch):
    path = str(tmp_path / "m-0000.model")
    ck.write_checkpoint_file({"state_dict": {"w": torch.ones(2)}}, path)

    def torn_save(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        ck.write_checkpoint_file({"state_dict": {"w": torch.zeros(2)}}, path)
    assert os.listdir(str(tmp_path)) == ["m-0000.model"]
    assert torch.equal(ck.load_checkpoint_file(path)["state_dict"]["w"], torch.ones(2))


def _touch(path):
    with open(path, "wb") as f:
        f.write(b"x")


def test_find_resume_order_and_range(tmp_path):
    prefix = str(tmp_path / "vl")
    for name in ["vl-0000.model", "vl-0001.model", "vl-0001-b0000040.model", "vl-0002-b0000020.model",
                 "vl-best.model", ".vl-0002.model.abc.tmp", "vl-x-0003.model", "other-0004.model"]:
        _touch(str(tmp_path / name))
    found = ck.find_resume_checkpoint(prefix, 0, 10)
    names = [os.path.basename(p) for p in found]
    assert names == ["vl-0002-b0000020.model", "vl-0001.model", "vl-0001-b0000040.model", "vl-0000.model"]
    assert [os.path.basename(p) for p in ck.find_resume_checkpoint(prefix, 2, 10)] == ["vl-0002-b0000020.model"]
    assert [os.path.basename(p) for p in ck.find_resume_checkpoint(prefix, 0, 2)] == names[1:]
    assert ck.find_resume_checkpoint(prefix, 0, 10, auto_resume=False) == []
    assert ck.find_resume_checkpoint(prefix, 2, 10, resume=True) == [str(tmp_path / "vl-0001.model")]
    with pytest.raises(FileNotFoundError, match="BEGIN_EPOCH=5 needs .*vl-0004.model"):
        ck.find_resume_checkpoint(prefix, 5, 10, resume=True)
    ck.remove_stale_temp_files(prefix)
    assert not (tmp_path / ".vl-0002.model.abc.tmp").exists()


def test_resume_skips_corrupt_newest(tmp_path):
    prefix = str(tmp_path / "vl")
    net, opt, _ = _trained()
    ck.save_checkpoint(ck.epoch_checkpoint_path(prefix, 0), net, opt, train_state=new_train_state(epoch=1))
    _touch(ck.step_checkpoint_path(prefix, 1, 4))  # torn by something that did not write atomically
    cfg = types.SimpleNamespace(RESUME=False, AUTO_RESUME=True, BEGIN_EPOCH=0, END_EPOCH=3)
    info = ck.resume_training(prefix, cfg, Net(), torch.optim.SGD(Net().parameters(), lr=1.))
    assert info.path == ck.epoch_checkpoint_path(prefix, 0) and info.state["epoch"] == 1
    cfg.AUTO_RESUME = False
    assert ck.resume_training(prefix, cfg, Net(), torch.optim.SGD(Net().parameters(), lr=1.)) is None


def test_epoch_callback_frequency_and_best(tmp_path):
    prefix = str(tmp_path / "vl")
    net, opt, sched = _trained()
    scaler = amp.LossScaler()
    cb = Checkpoint(ck.Checkpointer(net, opt, prefix, config="A: 1\n", scaler=scaler, lr_scheduler=sched,
                                    validation_monitor=Monitor(best_epoch=1)), frequent=2)
    for epoch in range(4):
        cb.after_epoch(TrainContext(net, opt, sched, scaler, new_train_state(epoch=epoch + 1), epoch=epoch))
    assert sorted(os.listdir(str(tmp_path))) == ["vl-0001.model", "vl-0003.model", "vl-best.model"]
    best = ck.load_checkpoint_file(ck.best_checkpoint_path(prefix))
    assert best["train_state"]["epoch"] == 2 and best["config"] == "A: 1\n"


def test_step_callback_saves_every_n_and_keeps_last(tmp_path):
    prefix = str(tmp_path / "vl")
    net, opt, sched = _trained()
    state = new_train_state(epoch=3)
    scaler = amp.LossScaler()
    ctx = TrainContext(net, opt, sched, scaler, state, epoch=3)
    cb = StepCheckpoint(ck.Checkpointer(net, opt, prefix, scaler=scaler, lr_scheduler=sched), every_steps=2, keep=2)
    for nbatch in range(12):  # accumulation k=2: steps end at odd batches
        ctx.micro_batch, ctx.step_ended = nbatch, nbatch % 2 == 1
        state["epoch_batch"] = nbatch + 1
        if ctx.step_ended:
            state["global_step"] += 1
        cb.after_batch(ctx)
    # steps at batches 2, 4, 6 done -> saved at epoch_batch 4, 8, 12; keep the last 2
    assert sorted(os.listdir(str(tmp_path))) == ["vl-0003-b0000008.model", "vl-0003-b0000012.model"]
    saved = ck.load_checkpoint_file(ck.step_checkpoint_path(prefix, 3, 12))["train_state"]
    assert (saved["epoch"], saved["epoch_batch"], saved["global_step"]) == (3, 12, 6)


def test_checkpoint_hooks_from_config():
    from vcr.task import TASK as VCR_TASK
    cfg = VCR_TASK.load_config(None, ["TRAIN.CHECKPOINT_STEPS", "50", "TRAIN.CHECKPOINT_KEEP", "3"])
    checkpointer = ck.Checkpointer(Net(), None, "out/vl", config=cfg)
    epoch_end, step = checkpoint_hooks(checkpointer, cfg)
    assert epoch_end.frequent == cfg.CHECKPOINT_FREQUENT
    assert (step.every_steps, step.keep) == (50, 3)
    assert len(checkpoint_hooks(checkpointer, VCR_TASK.load_config(None))) == 1


# --- partial pretrain (NETWORK.PARTIAL_PRETRAIN*) --------------------------------------------- #
VCR_PREFIX_CHANGES = ["vlbert.mvrc_head.transform->cnn_loss_reg.0",
                      "module.vlbert.mvrc_head.transform->module.cnn_loss_reg.0",
                      "module.vlbert->module.vlbert._module",
                      "vlbert->vlbert._module"]


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_type_embeddings = nn.Embedding(3, 4)
        self.encoder = nn.Linear(4, 4)


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self._module = Inner()


class TinyVCR(nn.Module):
    def __init__(self):
        super().__init__()
        self.vlbert = Wrapper()
        self.cnn_loss_reg = nn.Sequential(nn.Module())
        self.cnn_loss_reg[0].dense = nn.Linear(4, 4)
        self.final_mlp = nn.Sequential(nn.Dropout(0.1), nn.Linear(4, 1))
        self.other = nn.Linear(2, 2)


def _vcr_renames(**options):
    return functools.partial(pretrain_renames, **options)


def _pretrain_file(tmp_path, module_prefix="module."):
    g = torch.Generator().manual_seed(0)
    sd = {
        "vlbert.token_type_embeddings.weight": torch.randn(3, 4, generator=g).half(),
        "vlbert.encoder.weight": torch.randn(4, 4, generator=g).half(),
        "vlbert.encoder.bias": torch.randn(4, generator=g).half(),
        "vlbert.mvrc_head.transform.dense.weight": torch.randn(4, 4, generator=g),
        "vlbert.mvrc_head.transform.dense.bias": torch.randn(4, generator=g),
        "vlbert.relationsip_head.caption_image_relationship.weight": torch.randn(2, 4, generator=g),
        "vlbert.relationsip_head.caption_image_relationship.bias": torch.randn(2, generator=g),
        "vlbert.mlm_head.predictions.bias": torch.randn(7, generator=g),
    }
    sd = {module_prefix + k: v for k, v in sd.items()}
    path = str(tmp_path / "vl-bert-base-e2e.model")
    torch.save({"state_dict": sd}, path)
    return path, {k[len(module_prefix):]: v for k, v in sd.items()}


@pytest.mark.parametrize("module_prefix", ["module.", ""])
@pytest.mark.parametrize("wrap", [False, True])
def test_partial_pretrain_vcr(tmp_path, module_prefix, wrap):
    path, src = _pretrain_file(tmp_path, module_prefix)
    torch.manual_seed(0)
    model = TinyVCR()
    init_other = model.other.weight.clone()
    target = nn.DataParallel(model) if wrap else model
    report = load_partial_pretrain(target, path, VCR_PREFIX_CHANGES, _vcr_renames(segmb_init=True, load_rel_head=True))

    tte = src["vlbert.token_type_embeddings.weight"].float()
    got = model.vlbert._module.token_type_embeddings.weight
    assert torch.equal(got[0], tte[0]) and torch.equal(got[1], tte[0]) and torch.equal(got[2], tte[2])
    assert torch.equal(model.vlbert._module.encoder.weight, src["vlbert.encoder.weight"].float())
    assert torch.equal(model.cnn_loss_reg[0].dense.weight, src["vlbert.mvrc_head.transform.dense.weight"])
    rel_w = src["vlbert.relationsip_head.caption_image_relationship.weight"]
    rel_b = src["vlbert.relationsip_head.caption_image_relationship.bias"]
    assert torch.equal(model.final_mlp[1].weight, rel_w[1:2] - rel_w[0:1])
    assert torch.equal(model.final_mlp[1].bias, rel_b[1:2] - rel_b[0:1])
    assert torch.equal(model.other.weight, init_other)

    pre = "module." if wrap else ""
    assert sorted(report.not_loaded) == [pre + "other.bias", pre + "other.weight"]
    assert sorted(report.unmatched) == ["vlbert._module.mlm_head.predictions.bias",
                                        "vlbert._module.relationsip_head.caption_image_relationship.bias",
                                        "vlbert._module.relationsip_head.caption_image_relationship.weight"]
    assert len(report.loaded) == 7


def test_partial_pretrain_without_options(tmp_path):
    path, src = _pretrain_file(tmp_path)
    model = TinyVCR()
    before = model.final_mlp[1].weight.clone()
    report = load_partial_pretrain(model, path, ["module.vlbert->module.vlbert._module"])
    assert torch.equal(model.final_mlp[1].weight, before)
    assert torch.equal(model.vlbert._module.token_type_embeddings.weight,
                       src["vlbert.token_type_embeddings.weight"].float())
    assert "cnn_loss_reg.0.dense.weight" in report.not_loaded


def test_partial_pretrain_errors(tmp_path):
    path, _ = _pretrain_file(tmp_path)
    with pytest.raises(ValueError, match="'old_prefix->new_prefix', got 'vlbert'"):
        load_partial_pretrain(TinyVCR(), path, ["vlbert"])
    with pytest.raises(ck.CheckpointError, match="SEGMB_INIT.*vlbert._module.token_type_embeddings.weight"):
        load_partial_pretrain(TinyVCR(), path, [], _vcr_renames(segmb_init=True))
    model = TinyVCR()
    model.vlbert._module.encoder = nn.Linear(4, 5)
    with pytest.raises(ck.CheckpointError, match=r"encoder.weight has shape \(4, 4\) in the checkpoint but \(5, 4\)"):
        load_partial_pretrain(model, path, VCR_PREFIX_CHANGES)


# --- with the real task models (tiny sizes) ------------------------------------------------------ #
@pytest.mark.filterwarnings("ignore")
def test_reference_checkpoint_and_partial_pretrain_with_task_models(tmp_path):
    from tests.test_modules import CFGS, TINY, build
    from vcr.task import TASK as VCR_TASK

    vcr = build("vcr", "base_q2a_4x16G_fp32.yaml", TINY)
    # a reference fp16 run's file: DataParallel keys, fp16 floating tensors
    ref = {"module." + k: (v.half() if v.is_floating_point() else v) for k, v in vcr.state_dict().items()}
    path = str(tmp_path / "vl-bert_base_res101_vcr-0019.model")
    torch.save({"state_dict": ref, "optimizer": {}, "validation_monitor": {"best_epoch": 19, "best_val": 0.7}}, path)
    ours = build("vcr", "base_q2a_4x16G_fp32.yaml", TINY)
    ck.load_model_state_dict(ours, ck.load_checkpoint_file(path)["state_dict"], path)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, ref["module." + k].to(v.dtype)), k

    cfg = VCR_TASK.load_config(os.path.join(CFGS, "vcr", "base_q2a_4x16G_fp32.yaml"), TINY)
    pre = build("pretrain", "base_e2e_16x16G_fp16.yaml", TINY)
    g = torch.Generator().manual_seed(1)  # values unlike any fresh init
    pre_sd = {"module." + k: torch.randn(v.shape, generator=g).half() if v.is_floating_point() else v
              for k, v in pre.state_dict().items()}
    pre_path = str(tmp_path / "vl-bert-base-e2e.model")
    torch.save({"state_dict": pre_sd}, pre_path)
    fresh = build("vcr", "base_q2a_4x16G_fp32.yaml", TINY)
    init = {k: v.clone() for k, v in fresh.state_dict().items()}
    from vcr.task import TASK
    report = load_partial_pretrain(fresh, pre_path, cfg.NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES,
                                      TASK.pretrain_renames(cfg))
    tte = fresh.vlbert._module.token_type_embeddings.weight
    src = pre_sd["module.vlbert.token_type_embeddings.weight"].float()
    assert torch.equal(tte[0], src[0]) and torch.equal(tte[1], src[0]) and torch.equal(tte[2], src[2])
    assert torch.equal(fresh.cnn_loss_reg[0].dense.weight,
                       pre_sd["module.vlbert.mvrc_head.transform.dense.weight"].float())
    assert torch.equal(fresh.vlbert._module.encoder.layer[0].attention.self.query.weight,
                       pre_sd["module.vlbert.encoder.layer.0.attention.self.query.weight"].float())
    # e2e pretraining has no relationship head or pooler: the VCR head stays at init
    assert sorted(report.not_loaded) == ["cnn_loss_reg.2.bias", "cnn_loss_reg.2.weight", "final_mlp.1.bias",
                                         "final_mlp.1.weight", "vlbert._module.pooler.dense.bias",
                                         "vlbert._module.pooler.dense.weight"]
    for k in report.not_loaded:
        assert torch.equal(fresh.state_dict()[k], init[k])
    assert len(report.loaded) == len(init) - 6
    assert sorted({k.split(".predictions")[0].split(".region_cls")[0] for k in report.unmatched}) == [
        "aux_text_visual_embedding.weight", "object_mask_word_embedding.weight",
        "vlbert._module.mlm_head", "vlbert._module.mvrc_head"]


def test_checkpoint_every_fraction_of_the_run():
    """TRAIN.CHECKPOINT_EVERY_FRACTION 0.2 of 5 epochs x 8 steps: a mid-epoch file every 8 steps, also
    alongside CHECKPOINT_STEPS."""
    from common.hooks.checkpoint import checkpoint_hooks
    from vcr.task import TASK

    load_config = TASK.load_config
    opts = ["TRAIN.CHECKPOINT_EVERY_FRACTION", "0.2", "TRAIN.END_EPOCH", "5"]
    checkpointer = ck.Checkpointer(torch.nn.Linear(1, 1), None, "out/vl")
    _, step = checkpoint_hooks(checkpointer, load_config(None, opts), steps_per_epoch=8)
    assert (step.every_steps, step.periods) == (0, [8])
    _, step = checkpoint_hooks(checkpointer, load_config(None, opts + ["TRAIN.CHECKPOINT_STEPS", "3"]), steps_per_epoch=8)
    assert step.periods == [3, 8]


def test_async_sharded_save_is_named_when_written_and_holds_the_state_of_its_call(tmp_path):
    """TRAIN.ASYNC_CHECKPOINT's save (one process, no process group): the folder gets its name from the writer's
    thread, before anyone waits, and a tensor changed after the call returns is saved as it was at the call."""
    from common.checkpoint.sharded import save_sharded_checkpoint
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ckpt = {"state_dict": {"w": weight}, "train_state": {"global_step": 3}}
    path = str(tmp_path / "run-0001.model")
    pending = save_sharded_checkpoint(ckpt, path, async_save=True)
    weight.add_(100.0)  # the next optimizer step, while the write may still go on
    assert pending.named.wait(timeout=60)
    assert os.path.isdir(path) and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    pending.wait()
    back = ck.load_checkpoint_file(path)
    # the same bytes written and read back: exact
    assert torch.equal(back["state_dict"]["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert back["train_state"] == {"global_step": 3}
