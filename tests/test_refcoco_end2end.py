"""RefCOCO+ commands end to end on CPU, on the tiny fixture data (tests/refcoco_fixture.py):

* each of the four paper configs trains a few steps at tiny size through ``refcoco/train_end2end.py``,
  fine-tuning from a tiny pretraining checkpoint (NETWORK.PARTIAL_PRETRAIN, the reference's prefix changes),
  with every other effective value the reference's;
* ``refcoco/test.py`` writes the result JSON and the accuracy per split; ``refcoco/val.py`` gives the
  accuracy of the epoch-end validation;
* evaluation on 2 ranks with uneven shards counts each expression once: a 2-rank run through
  ``scripts/dist_run_single.sh`` reports the single-process accuracy, and the validation loop on 2 gloo
  ranks gives the exact single-process sums.

The BERT folder and ResNet-18 weights are those of the tiny VCR runs (tests/tiny_vcr.py); the pretraining
checkpoint is made here from them (tiny_vcr's own has random values everywhere, which overflow in a forward).
"""
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from yacs.config import CfgNode

from common.config.keys import leaf_keys
from tests.conftest import ROOT
from tests.refcoco_fixture import VAL_SET, tiny_opts, write_refcoco
from tests.tiny_vcr import LAUNCH_ENV, run_script

CFGS = os.path.join(ROOT, "cfgs", "refcoco")
PAPER_CFGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CFGS, "*_4x16G.yaml")))
REFERENCE = json.load(open(os.path.join(ROOT, "tests", "data", "reference_configs.json")))
# Fixture splits: train 2 expressions, val 1, testA 1, testB 1 (TRAIN_SET, VAL_SET of tests/refcoco_fixture.py).
TRAIN_ITEMS, VAL_ITEMS = 4, 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_refcoco(str(tmp_path_factory.mktemp("refcoco_data")))


@pytest.fixture(scope="module")
def pretrain_file(tiny_vcr, data, tmp_path_factory):
    """A reference-style e2e pretraining checkpoint of the tiny architecture: the pretraining model built on
    the tiny BERT and ResNet-18, every float tensor moved by noise of std 0.01 (so that no fresh model holds
    the same values), fp16, DataParallel ``module.`` keys."""
    import warnings
    from pretrain.task import TASK as PRETRAIN_TASK
    from pretrain.modules import MODELS

    opts = tiny_opts(tiny_vcr, data, "")
    pairs = [(k, v) for k, v in zip(opts[::2], opts[1::2])
             if k.startswith("NETWORK.") and k != "NETWORK.PARTIAL_PRETRAIN"]
    cfg = PRETRAIN_TASK.load_config(os.path.join(ROOT, "cfgs", "pretrain", "base_e2e_16x16G_fp16.yaml"),
                      [x for pair in pairs for x in pair])
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random-init warnings of the heads
        model = MODELS.build(cfg)
    g = torch.Generator().manual_seed(4)
    state = {"module." + k: (v + 0.01 * torch.randn(v.shape, generator=g) * (not k.endswith("running_var"))).half()
             if v.is_floating_point() else v for k, v in model.state_dict().items()}
    path = str(tmp_path_factory.mktemp("refcoco_pretrain") / "vl-bert-tiny-e2e.model")
    torch.save({"state_dict": state}, path)
    return path


def run(args):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **LAUNCH_ENV))


def run_folder(model_dir):
    """The output folder of a training run under ``model_dir`` (the one holding config.yaml)."""
    found = glob.glob(os.path.join(str(model_dir), "output", "**", "config.yaml"), recursive=True)
    assert len(found) == 1, found
    return os.path.dirname(found[0])


def train_in_process(model_dir, cfg_name, opts):
    """``python refcoco/train_end2end.py --cfg CFG --model-dir model_dir --opts ...`` run in this process (its
    ``__main__`` through runpy: no interpreter start-up), on one thread. Returns (output folder, its log text)."""
    code = run_script(os.path.join(ROOT, "refcoco", "train_end2end.py"),
                      ["--cfg", os.path.join(CFGS, cfg_name), "--model-dir", str(model_dir), "--opts"] + list(opts))
    assert code in (0, None), "exit code {}".format(code)
    folder = run_folder(model_dir)
    logs = sorted(glob.glob(os.path.join(folder, "*.log")))
    assert logs, folder
    return folder, "".join(open(p).read() for p in logs)


_RUNS = {}


def train(tiny_vcr, data, pretrain_file, tmp_path_factory, cfg_name):
    """(output folder, log text, opts) of the tiny run of ``cfg_name`` (once per module)."""
    if cfg_name not in _RUNS:
        opts = tiny_opts(tiny_vcr, data, pretrain_file)
        folder, log = train_in_process(tmp_path_factory.mktemp("refcoco_" + cfg_name[:-5]), cfg_name, opts)
        _RUNS[cfg_name] = folder, log, opts
    return _RUNS[cfg_name]


def flat(node):
    """{dotted key: value as JSON would give it} of a CfgNode."""
    return {key: json.loads(json.dumps(value)) for key, value in leaf_keys(node)}


@pytest.mark.parametrize("cfg_name", PAPER_CFGS)
def test_paper_config_trains_at_tiny_size_from_a_pretraining_checkpoint(tiny_vcr, data, pretrain_file, tmp_path_factory,
                                                                       cfg_name):
    folder, log, opts = train(tiny_vcr, data, pretrain_file, tmp_path_factory, cfg_name)
    # the effective config is the reference's, apart from the tiny overrides (and the resolved output path)
    with open(os.path.join(folder, "config.yaml")) as f:
        written = flat(CfgNode(yaml.safe_load(f)))
    reference = flat(CfgNode(REFERENCE["cfgs/refcoco/" + cfg_name]))
    overridden = set(opts[::2]) | {"OUTPUT_PATH"}
    assert {k: v for k, v in written.items() if k in reference and k not in overridden} == \
        {k: v for k, v in reference.items() if k not in overridden}
    # 4 items in micro-batches of 1, GRAD_ACCUMULATE_STEPS of the paper config (2 base, 4 large), 2 epochs
    config = REFERENCE["cfgs/refcoco/" + cfg_name]
    prefix = os.path.join(folder, config["MODEL_PREFIX"])
    final = torch.load(prefix + "-0001.model", map_location="cpu", weights_only=True)
    assert final["train_state"]["global_step"] == 2 * TRAIN_ITEMS // config["TRAIN"]["GRAD_ACCUMULATE_STEPS"]
    # the pretraining checkpoint filled the encoder and, through the prefix changes, the head's MVRC transform
    loaded = re.search(r"\[Partial Load\] loaded keys: (.*)", log).group(1)
    assert "final_mlp.0.dense.weight" in loaded and "vlbert.encoder.layer.1.output.dense.weight" in loaded
    assert len(re.findall(r"Epoch\[\d\] \tVal-RefAcc=[0-9.]+", log)) == 2
    assert re.search(r"Train-RefAcc=[0-9.]+,\tClsLoss=[0-9.]+", log)


def test_partial_pretrain_maps_the_mvrc_transform_onto_the_head(tiny_vcr, data, pretrain_file, tmp_path):
    """With LR 0 the epoch checkpoint holds the pretraining file's tensors under the reference's renames."""
    opts = tiny_opts(tiny_vcr, data, pretrain_file, TRAIN__LR=0.0, TRAIN__END_EPOCH=1)
    folder, _ = train_in_process(tmp_path, PAPER_CFGS[0], opts)
    ckpt = glob.glob(os.path.join(folder, "*-0000.model"))[0]
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    pretrain = torch.load(pretrain_file, map_location="cpu", weights_only=True)["state_dict"]
    for ours, theirs in (("final_mlp.0.dense.weight", "module.vlbert.mvrc_head.transform.dense.weight"),
                         ("vlbert.encoder.layer.0.attention.self.query.weight",
                          "module.vlbert.encoder.layer.0.attention.self.query.weight")):
        assert torch.equal(state[ours], pretrain[theirs].float()), ours


def accuracy_lines(text):
    """{split: (accuracy, correct, total)} of the ``RefCOCO+ accuracy on ...`` lines."""
    return {m[0]: (float(m[1]), int(m[2]), int(m[3]))
            for m in re.findall(r"RefCOCO\+ accuracy on (\S+): ([0-9.]+) \((\d+) of (\d+) expressions\)", text)}


def test_test_writes_result_json_and_accuracy_per_split(tiny_vcr, data, pretrain_file, tmp_path_factory, tmp_path):
    from common.data.tokenizer import build_tokenizer
    from refcoco.data import RefCOCO
    from refcoco.metrics import grounding_correct

    folder, _, opts = train(tiny_vcr, data, pretrain_file, tmp_path_factory, "base_detected_regions_4x16G.yaml")
    ckpt = os.path.join(folder, "vl-bert_base_res101_refcoco-best.model")
    out = run([sys.executable, "refcoco/test.py", "--cfg", os.path.join(CFGS, "base_detected_regions_4x16G.yaml"),
               "--ckpt", ckpt, "--split", "test", "val", "--result-path", str(tmp_path), "--result-name", "tiny",
               "--opts"] + opts)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = accuracy_lines(out.stdout)
    assert sorted(printed) == ["test", "testA", "testB", "val"]
    for split, refs in (("test", [3, 4]), ("val", [2])):
        with open(tmp_path / "tiny_refcoco+_{}.json".format(split)) as f:
            rows = json.load(f)
        assert [r["ref_id"] for r in rows] == refs and [r["sent_id"] for r in rows] == refs  # one sentence each
        dataset = RefCOCO(split, data, build_tokenizer(tiny_vcr.bert), boxes="proposal", test_mode=True)
        boxes = torch.tensor([r["box"] for r in rows])
        # a candidate (TEST_BOXES proposal, or the image) in original pixels, up to the clipping to the resized
        # image (20x50 -> 19x48 px: the image box [0, 0, 19, 49] comes back as [0, 0, 18.95, 48.94])
        for index, box in enumerate(boxes):
            item = dataset.items[index]
            image_box = torch.tensor([[0.0, 0.0, item["width"] - 1, item["height"] - 1]])
            assert torch.isclose(torch.cat([image_box, dataset.candidate_boxes(index)]), box, atol=0.5).all(1).any()
        correct = grounding_correct(boxes, dataset.referred_boxes)
        per_split = {"val": correct} if split == "val" else {"testA": correct[:1], "testB": correct[1:],
                                                             "test": correct}
        for name, c in per_split.items():
            assert printed[name] == (c.double().mean().item(), int(c.sum()), len(c)), name


def test_val_gives_the_epoch_end_validation_accuracy(tiny_vcr, data, pretrain_file, tmp_path_factory):
    folder, log, opts = train(tiny_vcr, data, pretrain_file, tmp_path_factory, "base_detected_regions_4x16G.yaml")
    out = run([sys.executable, "refcoco/val.py", "--cfg", os.path.join(CFGS, "base_detected_regions_4x16G.yaml"),
               "--ckpt", os.path.join(folder, "vl-bert_base_res101_refcoco-0001.model"), "--opts"] + opts)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = accuracy_lines(out.stdout)
    assert [(k, v[2]) for k, v in printed.items()] == [("train", 2), ("val", 1), ("testA", 1), ("testB", 1),
                                                       (VAL_SET, VAL_ITEMS)]
    assert sum(v[1] for k, v in printed.items() if k != VAL_SET) == printed[VAL_SET][1]
    epoch_end = re.findall(r"Epoch\[1\] \tVal-RefAcc=([0-9.]+)", log)
    assert epoch_end == ["{:f}".format(printed[VAL_SET][0])]


def test_two_rank_run_validates_uneven_shards_as_one_process(tiny_vcr, data, pretrain_file, tmp_path):
    """5 val expressions on 2 ranks (2 and 3 items, 1 and 2 batches): the epoch-end accuracy of the 2-rank run
    equals refcoco/val.py's on one process for the same checkpoint, every expression counted once."""
    cfg = os.path.join(CFGS, "base_gt_boxes_4x16G.yaml")
    opts = tiny_opts(tiny_vcr, data, pretrain_file, TRAIN__END_EPOCH=1)
    out = run(["./scripts/dist_run_single.sh", "2", "refcoco/train_end2end.py", cfg, str(tmp_path), "--opts"] + opts)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "training on 2 process(es)" in log
    ckpt = glob.glob(os.path.join(run_folder(tmp_path), "*-0000.model"))[0]
    val = run([sys.executable, "refcoco/val.py", "--cfg", cfg, "--ckpt", ckpt, "--opts"] + opts)
    assert val.returncode == 0, val.stderr[-3000:]
    single = accuracy_lines(val.stdout)[VAL_SET]
    assert single[2] == VAL_ITEMS
    assert re.findall(r"Epoch\[0\] \tVal-RefAcc=([0-9.]+)", log) == ["{:f}".format(single[0])]


# ------------------------------------------------------------------------------------------------ #
# The validation loop on 2 gloo ranks, with predictions known in advance
# ------------------------------------------------------------------------------------------------ #
class Oracle(torch.nn.Module):
    """Stands in for the model: picks the referred box for even dataset indices, a box 100 px away for odd
    ones (accuracy 3/5 on 5 items)."""

    def __init__(self, referred):
        super().__init__()
        self.referred = referred
        self.unused = torch.nn.Parameter(torch.zeros(1))  # the loop reads the device from a parameter

    def forward(self, image, boxes, im_info, expression):
        index = im_info[:, 4].long()
        pred = self.referred[index] + 100.0 * (index % 2 == 1).float()[:, None]
        return {"pred_boxes": pred, "index": index}


def _validate(cfg, world_size, rank):
    """(accuracy, summed correct, summed count) of the epoch-end validation pieces on this rank."""
    from common.engine import build_loader, run_validation
    from refcoco.task import TASK

    loader = build_loader(TASK, cfg, "val", world_size, rank)
    metrics = TASK.build_metrics(cfg, False)
    run_validation(Oracle(loader.dataset.referred_boxes), loader, metrics, cfg.DATASET.LABEL_INDEX_IN_BATCH)
    ref_acc = metrics.get_metric(0)
    sums = torch.stack([torch.as_tensor(ref_acc.sum_metric), torch.as_tensor(ref_acc.num_inst)]).double()
    if world_size > 1:
        torch.distributed.all_reduce(sums)
    return dict(metrics.get_name_value())["RefAcc"], sums.tolist(), len(loader)


def _validation_worker(rank, world_size, port, cfg, results):
    from common.runtime import distributed as cdist
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cdist.init_distributed(True, timeout_s=60)
    results[rank] = _validate(cfg, world_size, rank)
    cdist.cleanup()


def test_validation_on_two_gloo_ranks_counts_each_expression_once(tiny_vcr, data):
    import torch.multiprocessing as mp
    from refcoco.task import TASK as REFCOCO_TASK
    from tests.test_distributed import free_port

    cfg = REFCOCO_TASK.load_config(os.path.join(CFGS, "base_gt_boxes_4x16G.yaml"), tiny_opts(tiny_vcr, data, ""))
    single = _validate(cfg, 1, 0)
    assert single[:2] == (0.6, [3.0, 5.0])
    results = mp.Manager().dict()
    mp.start_processes(_validation_worker, args=(2, free_port(), cfg, results), nprocs=2, start_method="spawn")
    # rank 0: items 0-1 in one batch, rank 1: items 2-4 in two batches; the same global sums on both
    assert [results[r] for r in (0, 1)] == [(0.6, [3.0, 5.0], 1), (0.6, [3.0, 5.0], 2)]
