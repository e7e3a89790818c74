"""bench/memory_estimate.py: the per-rank memory traced on meta tensors against the same step measured in real
gloo processes (the CPU allocator's events), within 10%, on the tiny configs; FSDP's parameters + gradients +
optimizer state per rank at most 1/N of DDP's + 5%."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TOOL = os.path.join(ROOT, "bench", "memory_estimate.py")
TOLERANCE = 0.10  # measured / estimated, per figure
FIGURES = ("parameters", "gradients", "optimizer state", "ddp buckets", "activations", "peak")


def run_tool(tmp_path, *args):
    """The tool's JSON output of a run with ``args`` (exit code 0 expected)."""
    out = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, TOOL, "--json", str(out), *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def total(value):
    return sum(value.values()) if isinstance(value, dict) else value


def state(figures):
    """Parameters + gradients + optimizer state, bytes per rank."""
    return sum(total(figures[k]) for k in ("parameters", "gradients", "optimizer state"))


# The measured peak of a bf16 step holds oneDNN's scratch buffers, which the trace cannot know and which depend on
# the CPU: +3% (DDP) / +6% (FSDP) over the estimate on this AMX machine, +15% / +24% with oneDNN held to
# AVX512_CORE_VNNI (the CI pass playing an AVX-512 CPU without AMX). fp32 peaks stay within TOLERANCE.
BF16_PEAK_TOLERANCE = 0.30


def check_against_measured(run, peak_tolerance=TOLERANCE):
    """Every figure of every rank within TOLERANCE of the estimate (the peak within ``peak_tolerance``)."""
    est = run["estimate"]
    assert len(run["measured"]) == run["world_size"]
    for rank, measured in enumerate(run["measured"]):
        for key in FIGURES:
            e, m = total(est[key]), total(measured[key])
            tolerance = peak_tolerance if key == "peak" else TOLERANCE
            assert abs(m - e) <= tolerance * e, (run["world_size"], run["strategy"], rank, key, e, m)


def check_fsdp_share(runs):
    """FSDP's parameters + gradients + optimizer state per rank <= 1/N of DDP's + 5%, for each N of ``runs``."""
    ddp = {r["world_size"]: state(r["estimate"]) for r in runs if r["strategy"] == "ddp"}
    for r in runs:
        if r["strategy"] == "fsdp":
            n = r["world_size"]
            assert state(r["estimate"]) <= ddp[n] / n * 1.05, (n, state(r["estimate"]), ddp[n])


def test_fsdp_bf16_state_and_checkpointing_on_2_ranks_match_the_measured_step(tmp_path):
    """The ViT demo in bf16 with bf16 AdamW moments and gradient checkpointing, DDP and FSDP on 2 gloo ranks."""
    saved = run_tool(tmp_path, "--cfg", "cfgs/cls/demo_cpu.yaml", "--world-size", "2", "--strategy", "ddp", "fsdp",
                     "--precision", "bf16", "--checkpointing", "--measure",
                     "--opts", "TRAIN.OPTIM_STATE_DTYPE", "bfloat16")
    assert saved["precision"] == "bf16" and saved["checkpointing"] is True
    runs = saved["runs"]
    for run in runs:
        check_against_measured(run, peak_tolerance=BF16_PEAK_TOLERANCE)
        est = run["estimate"]
        # fp32 master weights and gradients; two bf16 moments: as many bytes as the fp32 weights
        assert set(est["parameters"]) == set(est["gradients"]) == {"float32"}
        assert est["optimizer state"] == {"bfloat16": est["parameters"]["float32"]}
    ddp, fsdp = (r["estimate"] for r in runs)
    assert ddp["ddp buckets"] == ddp["gradients"]["float32"] and fsdp["ddp buckets"] == 0
    check_fsdp_share(runs)


@pytest.mark.slow
def test_vlbert_ddp_and_fsdp_on_1_and_2_ranks_match_the_measured_step(tmp_path):
    """The VCR demo (ResNet + VL-BERT: frozen and shared modules, masks that size the tokens), fp32."""
    runs = run_tool(tmp_path, "--cfg", "cfgs/vcr/demo_q2a_cpu.yaml", "--world-size", "1", "2", "--strategy", "ddp",
                    "fsdp", "--measure", "--opts", "TRAIN.BATCH_IMAGES", "1")["runs"]
    assert [(r["world_size"], r["strategy"]) for r in runs] == [(1, "ddp"), (1, "fsdp"), (2, "ddp"), (2, "fsdp")]
    for run in runs:
        check_against_measured(run)
    check_fsdp_share(runs)


@pytest.mark.slow
def test_checkpointing_shrinks_the_traced_activations_of_the_vlbert_demo(tmp_path):
    plain, ckpt = (run_tool(tmp_path, "--cfg", "cfgs/vcr/demo_q2a_cpu.yaml", *flag, "--opts", "TRAIN.BATCH_IMAGES",
                            "1")["runs"][0]["estimate"] for flag in ([], ["--checkpointing"]))
    assert state(plain) == state(ckpt)
    assert ckpt["activations"] < 0.8 * plain["activations"]


def test_fsdp_share_on_8_ranks_traced(tmp_path):
    """The ViT demo on 8 ranks: its one-row position embedding and class token, whole on every rank if sharded
    on dim 0 (10% over 1/N here), are sharded on their longest dimension."""
    runs = run_tool(tmp_path, "--cfg", "cfgs/cls/demo_cpu.yaml", "--world-size", "8", "--strategy", "ddp", "fsdp",
                    "--opts", "TRAIN.BATCH_IMAGES", "2")["runs"]
    check_fsdp_share(runs)


def test_a_task_without_a_synthetic_batch_is_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, TOOL, "--cfg", "cfgs/vqa/demo_cpu.yaml"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --cfg cfgs/vqa/demo_cpu.yaml: task 'vqa' has no synthetic batch here (tasks: cls, vcr; --task names "
        "one)")


@pytest.mark.slow
def test_vlbert_with_the_vit_image_encoder_under_fsdp_matches_the_measured_step(tmp_path):
    """The VCR demo with a tiny ViT image encoder, sharded per block on 2 ranks: its forward gathers the ranks'
    image sizes (an object collective), which the fake process group of the trace answers with this rank's."""
    from tests.test_vit_end2end import vit_opts

    cfg = "cfgs/vcr/demo_q2a_cpu.yaml"
    runs = run_tool(tmp_path, "--cfg", cfg, "--world-size", "2", "--strategy", "fsdp", "--measure", "--opts",
                    "TRAIN.BATCH_IMAGES", "1", *[str(o) for o in vit_opts("vcr", os.path.join(ROOT, cfg))])["runs"]
    for run in runs:
        check_against_measured(run)
