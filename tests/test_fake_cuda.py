"""Every task's CUDA path on a simulated GPU (tests/fake_cuda.py): one real batch of the task's own loader on
tiny data (bench/gpu_suite_inputs.py's runs), the model's train and eval forward in fp32, fp16 and bf16
autocast; the training entry point (Trainer loop with the fp16 loss scale, clipping, bf16 optimizer state,
EMA), its resume onto the device, the test script and the Predictor's attention maps. A CPU tensor meeting a
CUDA one, a float64 tensor made on the GPU or a dtype error fails with the file:line that caused it."""
import csv
import json
import math
import os
import re

import numpy as np
import pytest
import torch

from bench.gpu_suite_inputs import task_runs
from common import amp
from common.checkpoint.checkpointer import load_checkpoint_file, restore_checkpoint
from common.data.collate import Batch
from common.data.collate import to_device
from common.engine import build_loader, build_model
from common.inference import Predictor
from common.inference.evaluation import DatasetEvaluator, inference_on_dataset
from common.optim import build_optimizer
from tests.conftest import load_task, slow_cases
from tests.evaluators import OutputRows
from tests.fake_cuda import CUDA, ROOT, SIMULATED_DEVICE_NAME, CudaTensor, DeviceError, fake_cuda
from tests.golden import assert_ranking_close, close
from tests.test_vit_end2end import vit_opts
from tests.tiny_vcr import log_text_in, predictor_inputs, run_script

CASES = {  # name: (task run of task_runs, extra opts)
    "vcr-q2a": ("vcr", []),
    "vcr-qa2r": ("vcr", ["DATASET.TASK", "QA2R"]),
    "vqa": ("vqa", []),
    "refcoco": ("refcoco", []),
    "pretrain": ("pretrain", []),
    "cls": ("cls", []),
    "vqa-vit": ("vqa", "vit"),
    "vcr-vit": ("vcr", "vit"),
    "refcoco-vit": ("refcoco", "vit"),
    "pretrain-vit": ("pretrain", "vit"),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# relative tolerance of a loss under autocast against fp32 (a mean of log-softmaxes of a tiny model; the
# inputs of each matmul rounded to the dtype's unit roundoff, 2^-11 / 2^-8, with room for its growth)
LOSS_RTOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return task_runs(str(tmp_path_factory.mktemp("fake_cuda")))


def case_opts(runs, name):
    """The config overrides of case ``name``: its task run's, then the case's own (VQA's ViT reads the
    photographs, not the precomputed features)."""
    task_name, more = CASES[name]
    if more == "vit":
        more = vit_opts(task_name) + (["NETWORK.IMAGE_FEAT_PRECOMPUTED", "False", "SCALES", "[32, 48]"]
                                      if task_name == "vqa" else [])
    return list(runs[task_name]["opts"]) + more


def case_config(runs, name, *extra):
    task = load_task(CASES[name][0])
    cfg = task.load_config(runs[CASES[name][0]]["cfg"], case_opts(runs, name) + ["NUM_WORKERS_PER_GPU", "0"]
                           + list(extra))
    return task, cfg


def on_cuda(tree):
    """The tensors of a nested output, each asserted to be on the simulated GPU."""
    flat = torch.utils._pytree.tree_flatten(tree)[0]
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    bad = [tuple(t.shape) for t in tensors if not isinstance(t, CudaTensor)]
    assert not bad, "outputs left on the CPU: shapes {}".format(bad)
    return tensors


class FirstOutputs(DatasetEvaluator):
    """Keeps the floating-point output tensors of the first batch (the evaluator of the check)."""

    def reset(self):
        self.outputs = None

    def process(self, inputs, outputs):
        if self.outputs is None:
            self.outputs = {k: v for k, v in outputs.items()
                            if isinstance(v, torch.Tensor) and v.is_floating_point()}

    def evaluate(self):
        return self.outputs


def eval_outputs(task, cfg, model):
    """The first val batch's float outputs through :func:`common.inference.evaluation.inference_on_dataset`."""
    first = [next(iter(build_loader(task, cfg, "val")))]
    return inference_on_dataset(model, first, FirstOutputs(), task.label_index_in_batch(cfg))


def _swapped_tie(got_logits, ref_logits, rtol):
    """The two rows' argmaxes differ and the reference scores both within ``rtol`` of its largest magnitude."""
    i, j = int(got_logits.argmax()), int(ref_logits.argmax())
    return i != j and abs(ref_logits[i] - ref_logits[j]).item() <= rtol * (ref_logits.abs().max().item() + 1e-6)


def assert_close(outputs, reference, rtol, exact_choices=True):
    """Each output within ``rtol`` of the reference's largest magnitude (logits of a tiny model). Outputs picked
    by an argmax (RefCOCO+'s ``pred_boxes``) are compared with ``exact_choices`` only, and tie-aware: a row may
    differ where the candidates both computations chose tie within ``rtol`` in the reference's logits (the GPU's
    kernels, like another CPU's, may round either way); without it they are left out, the logits they come from
    are compared."""
    assert outputs.keys() == reference.keys() and reference
    for k, ref in reference.items():
        choice = not ("logits" in k or "loss" in k)
        if choice and not exact_choices:
            continue
        got = outputs[k].cpu_value.float()
        assert got.shape == ref.shape, k
        if choice:
            logits = [name for name in reference if "logits" in name and reference[name].shape[0] == ref.shape[0]]
            differ = (got != ref).reshape(ref.shape[0], -1).any(1)
            for row in differ.nonzero().flatten().tolist():
                assert any(_swapped_tie(outputs[name].cpu_value.float()[row], reference[name][row], rtol)
                           for name in logits), (k, row, got[row], ref[row])
            continue
        assert torch.equal(got.isnan(), ref.isnan()), k  # e.g. the loss of a batch without masked regions
        got, ref = got.nan_to_num(), ref.nan_to_num()
        assert (got - ref).abs().max().item() <= rtol * (ref.abs().max().item() + 1e-6), k


@pytest.mark.parametrize("name", list(CASES))
def test_forward_on_cuda_in_fp32_fp16_and_bf16(runs, name):
    """The eval forward through the evaluation loop over the val loader: the GPU's fp32 outputs equal the CPU's
    (the same values), the autocast ones are within LOSS_RTOL of them; the train forward of one batch of the
    train loader gives a finite loss; every output is on the GPU."""
    task, cfg = case_config(runs, name)
    torch.manual_seed(0)
    model = build_model(task, cfg)
    batch = next(iter(build_loader(task, cfg, "train")))
    cpu_outputs = eval_outputs(task, cfg, model)
    with fake_cuda():
        model.to(CUDA)
        batch = to_device(batch, CUDA)
        for dtype_name, dtype in DTYPES.items():
            with amp.autocast_context("cuda", dtype)():
                outputs = eval_outputs(task, cfg, model)
                on_cuda(outputs)
                assert_close(outputs, cpu_outputs, LOSS_RTOL[dtype_name], exact_choices=dtype == torch.float32)
                model.train()
                outputs, loss = model(*batch)
            on_cuda((outputs, loss))
            assert math.isfinite(loss.mean().item()), dtype_name


def run_file(model_dir, suffix):
    """The one file of the run under ``model_dir`` whose name ends with ``suffix``."""
    paths = [os.path.join(d, f) for d, _, files in os.walk(str(model_dir)) for f in files if f.endswith(suffix)]
    assert len(paths) == 1, (suffix, paths)
    return paths[0]


TRAIN_OPTS = ["TRAIN.FP16", "True", "TRAIN.FP16_DTYPE", "float16", "TRAIN.FP16_LOSS_SCALE", "'dynamic'",
              "TRAIN.CLIP_GRAD_NORM", "1.0", "TRAIN.OPTIMIZER", "AdamW", "TRAIN.OPTIM_STATE_DTYPE", "bfloat16",
              "TRAIN.EMA_DECAY", "0.9", "NUM_WORKERS_PER_GPU", "0"]


# Slow: a second VCR question mode and the ViT encoder on tasks other than VQA (each task and the ViT stay).
@pytest.mark.parametrize("name", slow_cases(list(CASES), ["vcr-qa2r", "vcr-vit", "refcoco-vit", "pretrain-vit"]))
def test_training_and_resume_on_cuda(runs, name, tmp_path):
    """The training entry point on the GPU (fp16 with the dynamic loss scale, clipping, bf16 AdamW moments, EMA;
    synthetic gradients, see tests/fake_cuda.py): one epoch, then one more resumed from its checkpoint; the
    optimizer state restored onto the GPU in bf16; the EMA weights written."""
    run = runs[CASES[name][0]]
    # fewer, larger validation batches (the simulated device costs per op, not per sample)
    val_batch = case_config(runs, name)[1].VAL.BATCH_IMAGES
    train_opts = TRAIN_OPTS + ["VAL.BATCH_IMAGES", json.dumps([8] * len(val_batch) if isinstance(val_batch, list)
                                                              else 8)]
    argv = ["--cfg", run["cfg"], "--model-dir", str(tmp_path), "--opts"] + case_opts(runs, name) + train_opts
    with fake_cuda():
        assert run_script(run["entry"], argv) in (0, None)
        assert run_script(run["entry"], argv + ["TRAIN.END_EPOCH", "2"]) in (0, None)
    log = log_text_in(os.path.dirname(run_file(tmp_path, "config.yaml")))
    assert "device cuda" in log and "Resumed from" in log
    with open(run_file(tmp_path, "run.json")) as f:  # the run record names the GPU it ran on
        env = json.load(f)["env"]
    assert env["devices"] == {"type": "cuda", "count": 1, "names": [SIMULATED_DEVICE_NAME]} and env["cudnn"] is None
    ckpt = load_checkpoint_file(run_file(tmp_path, "-0001.model"))
    state = ckpt["train_state"]
    assert (state["epoch"], state["skipped_steps"]) == (2, 0) and state["global_step"] > 0  # every step applied
    assert ckpt["amp"]["loss_scale"] > 1  # fp16: the dynamic scale ran
    assert math.isfinite(state["last_finite_loss"])
    assert run_file(tmp_path, "-ema.model")
    task, cfg = case_config(runs, name, *train_opts)
    with fake_cuda():
        model = build_model(task, cfg, CUDA)
        optimizer = build_optimizer(cfg, model, 1)
        restore_checkpoint(ckpt, model, optimizer, restore_rng=False)
        moments = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
        assert moments and all(isinstance(v, CudaTensor) and v.dtype == torch.bfloat16 for v in moments)
        assert all(isinstance(p, CudaTensor) for p in model.parameters())


LOCATION = re.compile(r"at ([\w./]+\.py):(\d+)")


def test_a_cpu_arange_in_a_forward_and_a_batch_field_left_on_the_cpu_are_caught_and_located(runs, monkeypatch):
    """The check fails where it should: a ``torch.arange`` without ``device=`` added in the VCR model's
    forward, and the batch's boxes not moved; each message names the op's file:line (and the arange's)."""
    task, cfg = case_config(runs, "vcr-q2a")
    model = build_model(task, cfg)
    batch = next(iter(build_loader(task, cfg, "train")))
    encode = type(model)._encode

    def encode_with_cpu_arange(self, image, *args):
        return encode(self, image + torch.arange(image.shape[-1]), *args)  # noqa: the injected bug

    arange_line = encode_with_cpu_arange.__code__.co_firstlineno + 1
    with fake_cuda():
        model.to(CUDA)
        on_gpu = to_device(batch, CUDA)
        with monkeypatch.context() as patch:
            patch.setattr(type(model), "_encode", encode_with_cpu_arange)
            with pytest.raises(DeviceError) as caught:
                model(*on_gpu)
        message = str(caught.value)
        assert "made at tests/test_fake_cuda.py:{}".format(arange_line) in message
        assert LOCATION.findall(message)[-1] == ("tests/test_fake_cuda.py", str(arange_line))  # where it met

        boxes = on_gpu.names.index("boxes")
        half_moved = Batch([b if i != boxes else batch[i] for i, b in enumerate(on_gpu)], on_gpu.names,
                           on_gpu.extras)
        with pytest.raises(DeviceError) as caught:
            model(*half_moved)
    message = str(caught.value)
    assert "from a tensor made before the check started" in message  # a box tensor derived from the CPU field
    path, line = LOCATION.findall(message)[-1]
    assert path.startswith(("vcr/", "common/")), message  # the model's own line that used the boxes
    with open(os.path.join(ROOT, path)) as f:
        assert 0 < int(line) <= len(f.read().splitlines())


def test_a_float64_tensor_and_a_dtype_mismatch_in_a_forward_are_caught_and_located(runs, monkeypatch):
    """The dtype checks: a float64 tensor made on the GPU in the VCR model's forward (a GPU's float64 is 30-60x
    slower), and a half-precision weight meeting fp32 activations outside autocast; each message names the
    injected line."""
    task, cfg = case_config(runs, "vcr-q2a")
    model = build_model(task, cfg)
    batch = next(iter(build_loader(task, cfg, "train")))
    encode = type(model)._encode

    def encode_in_float64(self, image, *args):
        return encode(self, image * torch.ones(image.shape[-1], dtype=torch.float64, device=image.device).float(),
                      *args)

    def encode_with_a_half_weight(self, image, *args):
        return encode(self, image @ torch.eye(image.shape[-1], device=image.device, dtype=torch.half), *args)

    with fake_cuda():
        model.to(CUDA)
        on_gpu = to_device(batch, CUDA)
        for injected, expected in ((encode_in_float64, "float64 tensor made on the GPU"),
                                   (encode_with_a_half_weight, "")):
            with monkeypatch.context() as patch:
                patch.setattr(type(model), "_encode", injected)
                with pytest.raises(DeviceError) as caught:
                    model(*on_gpu)
            message = str(caught.value)
            assert expected in message
            line = injected.__code__.co_firstlineno + 1
            assert ("tests/test_fake_cuda.py", str(line)) in LOCATION.findall(message), message


def test_test_py_and_the_predictor_with_attention_maps_on_cuda(runs, tmp_path):
    """vcr/test.py's inference (common/inference/evaluation.py) and ``Predictor(..., device='cuda')`` with
    ``attention()``
    on the GPU, from a checkpoint of the tiny VCR run: the predictor's probabilities are test.py's CSV ones, the
    attention rows sum to 1."""
    run = runs["vcr"]
    task, cfg = case_config(runs, "vcr-q2a")
    torch.manual_seed(0)
    model = build_model(task, cfg)
    ckpt = str(tmp_path / "vcr-0000.model")
    torch.save({"state_dict": model.state_dict(), "config": cfg.dump()}, ckpt)
    opts = list(run["opts"]) + ["NUM_WORKERS_PER_GPU", "0"]
    with fake_cuda():
        assert run_script(os.path.join(ROOT, "vcr", "test.py"), [
            "--a-cfg", run["cfg"], "--a-ckpt", ckpt, "--result-path", str(tmp_path / "res"), "--result-name", "t",
            "--opts"] + opts) in (0, None)
        predictor = Predictor.from_checkpoint(run["cfg"], ckpt, device="cuda", opts=opts + ["DATASET.TASK", "Q2A"])
        assert all(isinstance(p, CudaTensor) for p in predictor.model.parameters())
        anns, inputs = predictor_inputs(opts[opts.index("DATASET.DATASET_PATH") + 1])
        inputs = [{k: v for k, v in i.items() if k != "rationales"} for i in inputs]
        results = predictor(inputs)
        maps = predictor.attention(inputs[0])
    with open(tmp_path / "res" / "t_test_result_Q2A.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(results) == len(rows) == len(anns)
    for r, row in zip(results, rows):
        expected = [float(row["answer_{}".format(i)]) for i in range(4)]
        got = [p["score"] for p in sorted(r["predictions"], key=lambda p: p["index"])]
        assert got == pytest.approx(expected, abs=1e-5)  # one batch of all vs the loader's batches
    probs = maps["probs"]
    assert probs.ndim == 4 and probs.shape[-1] == len(maps["tokens"])
    assert np.allclose(probs.sum(-1), 1, atol=1e-4)  # each query's attention over the unpadded keys


@pytest.mark.parametrize("name", slow_cases(["vcr-qa2r", "vcr-vit", "vqa", "vqa-vit", "refcoco", "refcoco-vit", "cls"],
                                            ["vcr-vit", "refcoco-vit"]))
def test_test_py_on_cuda_writes_the_cpu_result_file(runs, name, tmp_path):
    """``<task>/test.py`` (common/inference/evaluation.py's inference) on the GPU, from a checkpoint of the case's tiny
    run (VCR Q->A: the test above): the result file holds the CPU run's predictions (answers and top-5 classes
    tie-aware, VCR's probabilities within 1e-5, boxes within 1e-4 pixels)."""
    import glob
    import json

    task_name = CASES[name][0]
    run = runs[task_name]
    task, cfg = case_config(runs, name)
    torch.manual_seed(0)
    model = build_model(task, cfg)
    ckpt = str(tmp_path / "model-0000.model")
    torch.save({"state_dict": model.state_dict(), "config": cfg.dump()}, ckpt)
    entry = os.path.join(ROOT, task_name, "test.py")
    model_args = ["--cfg", run["cfg"], "--ckpt", ckpt]
    if task_name == "vcr":  # the answer or the rationale model, by the case's DATASET.TASK
        role = {"Q2A": "a", "QA2R": "r"}[cfg.DATASET.TASK]
        model_args = ["--{}-cfg".format(role), run["cfg"], "--{}-ckpt".format(role), ckpt]
    results = {}
    for device in ("cpu", "cuda"):
        argv = model_args + ["--result-path", str(tmp_path / device), "--result-name", "t",
                             "--opts"] + case_opts(runs, name) + ["NUM_WORKERS_PER_GPU", "0"]
        if device == "cpu":
            assert run_script(entry, argv) in (0, None)
        else:
            with fake_cuda():
                assert run_script(entry, argv) in (0, None)
        path, = glob.glob(str(tmp_path / device / "t_*"))
        with open(path) as f:
            results[device] = json.load(f) if path.endswith(".json") else list(csv.reader(f))
    cpu, gpu = results["cpu"], results["cuda"]
    if task_name in ("cls", "vqa"):
        # Choices by argmax: the simulated device runs some ops through other kernels than the CPU run (its fp32
        # logits agree within LOSS_RTOL), so a choice may differ only between scores that tie within
        # tests/golden.py's tolerance in the CPU model's scores of the test set, in data set order.
        loader = build_loader(task, cfg, "test")
        scores = inference_on_dataset(model, loader, OutputRows("label_logits"), "label" if task_name == "cls" else None)
        if task_name == "cls":  # header, then index, label, predicted, top-5 names
            names = loader.dataset.classes
            assert gpu[0] == cpu[0] and len(gpu) == len(cpu) == len(scores) + 1 > 2
            for c, g, row in zip(cpu[1:], gpu[1:], scores):
                assert g[:2] == c[:2] and g[2] == g[3].split("|")[0], (g, c)
                assert_ranking_close(*[[(n, row[names.index(n)].item()) for n in r[3].split("|")] for r in (g, c)],
                                     "cls test row {}".format(c[0]))
        else:  # question id, answer
            vocab = loader.dataset.answer_vocab.answers
            assert [r["question_id"] for r in gpu] == [r["question_id"] for r in cpu] and len(cpu) == len(scores) > 1
            for c, g, row in zip(cpu, gpu, scores):
                assert close(row[vocab.index(g["answer"])].item(), row[vocab.index(c["answer"])].item()), (g, c)
    elif task_name == "vcr":  # header, then the annotation id and the probabilities of each item
        assert [r[0] for r in gpu] == [r[0] for r in cpu] and len(cpu) > 2
        assert np.allclose(np.array([r[1:] for r in gpu[1:]], dtype=float),
                           np.array([r[1:] for r in cpu[1:]], dtype=float), atol=1e-5)
    else:  # [{ref_id, sent_id, box}] in data set order
        assert [(r["ref_id"], r["sent_id"]) for r in gpu] == [(r["ref_id"], r["sent_id"]) for r in cpu] and cpu
        assert np.allclose([r["box"] for r in gpu], [r["box"] for r in cpu], atol=1e-4)


PREDICTOR_TEXT = {"vqa": {"question": "what color is it ?"}, "refcoco": {"expression": "the shape on the left"},
                  "pretrain": {"caption": "a [MASK] on the table"}, "cls": {}}
PREDICTOR_CASES = ["vcr-qa2r", "vqa", "refcoco", "pretrain", "cls", "vqa-vit", "vcr-vit", "refcoco-vit",
                   "pretrain-vit"]


@pytest.mark.parametrize("name", slow_cases(PREDICTOR_CASES, ["vcr-vit", "refcoco-vit", "pretrain-vit"]))
def test_the_predictor_with_attention_maps_on_cuda(runs, name, tmp_path):
    """``Predictor(..., device='cuda')`` of every case but VCR Q->A (the test above) on one of the tiny data's
    photographs: its predictions are the CPU predictor's (scores within 1e-6 relative: the GPU's fp32 may run
    other kernels, a ranking tie-aware) and, where the model has a VL-BERT, ``attention()`` gives rows that
    sum to 1."""
    from tests.test_eval_outputs import _checkpoint

    task_name = CASES[name][0]
    run = runs[task_name]
    task, cfg = case_config(runs, name)
    ckpt = _checkpoint(task, cfg, tmp_path / "model-0000.model")
    opts, extra = case_opts(runs, name) + ["NUM_WORKERS_PER_GPU", "0"], {}
    if name == "vqa":  # precomputed features: the predictor recomputes them with the encoder that made them
        from bench.smoke_paper_config import random_resnet_file
        from tests.test_predict import FEATURE_OPTS

        random_resnet_file(str(tmp_path / "resnet50"), 50)
        opts, extra = opts + FEATURE_OPTS, {"feature_weights": str(tmp_path / "resnet50-0000.model")}
        ckpt = _checkpoint(task, task.load_config(run["cfg"], opts), tmp_path / "model-0000.model")
    _, vcr_inputs = predictor_inputs(runs["vcr"]["opts"][runs["vcr"]["opts"].index("DATASET.DATASET_PATH") + 1])
    if task_name == "vcr":  # Q->A or QA->R by the case's DATASET.TASK: the rationales given answer 0
        inp = dict(vcr_inputs[0], answer_index=0) if cfg.DATASET.TASK == "QA2R" else \
            {k: v for k, v in vcr_inputs[0].items() if k != "rationales"}
    else:
        inp = dict(PREDICTOR_TEXT[task_name], image=vcr_inputs[0]["image"])
    grid = None if task_name in ("cls", "vcr") else {"kind": "grid", "grid": "2x2"}
    cpu = Predictor.from_checkpoint(run["cfg"], ckpt, opts=opts, box_source=grid, **extra)
    with fake_cuda():
        predictor = Predictor.from_checkpoint(run["cfg"], ckpt, device="cuda", opts=opts, box_source=grid, **extra)
        assert all(isinstance(p, CudaTensor) for p in predictor.model.parameters())
        got, = predictor(inp)
        maps = predictor.attention(inp) if task_name != "cls" else None
    want, = cpu(inp)
    key = "rationale_predictions" if "rationale_predictions" in want else "predictions"
    rankings = [want["masks"], got["masks"]] if task_name == "pretrain" else [[want[key]], [got[key]]]
    for w, g in zip(*rankings):
        assert w
        assert_ranking_close([(p["label"], p["score"]) for p in g], [(p["label"], p["score"]) for p in w], name)
    if maps is not None:
        assert maps["probs"].shape[-1] == len(maps["tokens"])
        assert np.allclose(maps["probs"].sum(-1), 1, atol=1e-4)
