"""Fine-tuning from a VCR checkpoint with the launch script (the path every VCR paper config takes:
NETWORK.PARTIAL_PRETRAIN), and the run's log file: it holds every line the run prints."""
import os
import re
import subprocess

import torch

from tests.tiny_vcr import ENTRY, LAUNCH_ENV, PREFIX, checkpoint, launch_command, log_text, output_folder


def test_finetune_from_a_checkpoint_logs_everything_it_prints(tmp_path, tiny_vcr, tiny_init):
    """``nondist_run.sh vcr/train_end2end.py CFG DIR --partial-pretrain CKPT`` at LR 0 with the
    checkpoint of another tiny run: every key is copied (no prefix change), training and validation
    run, and the log file holds each stdout line, among them the progress, validation, partial load
    and warning lines."""
    source = os.path.join(output_folder(tiny_init[0]), PREFIX + "-0000.model")
    opts = tiny_vcr.opts(TRAIN__LR=0.0, NETWORK__PARTIAL_PRETRAIN_PREFIX_CHANGES=[],
                         NETWORK__PARTIAL_PRETRAIN_SEGMB_INIT=False, NETWORK__IMAGE_PRETRAINED="")
    cmd = launch_command(ENTRY, tmp_path, opts, extra_args=["--partial-pretrain", source])
    proc = subprocess.run(cmd, env=dict(os.environ, **LAUNCH_ENV), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    expected = torch.load(source, weights_only=True)["state_dict"]
    got = checkpoint(tmp_path, 0)["state_dict"]
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)

    log = log_text(tmp_path)
    printed = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    missing = [line for line in printed if line not in log.splitlines()]
    assert printed and not missing, missing
    assert "[Partial Load] {}: {} keys loaded, 0 keys of the file not matched, 0 model keys left at init".format(
        source, len(expected)) in log
    assert "[Partial Load] non matched keys: []" in log
    assert re.search(r"Epoch\[0\] Batch \[7\]\tSpeed: [0-9.]+ samples/s", log)
    assert re.search(r"Epoch\[0\] \tVal-Acc=[0-9.]+", log)
    assert re.search(r"warning: .*GPUS = '0,1,2,3'", log)  # the config check's warning reaches the file
    # the pretrain file filled every weight, the ResNet's too: no random-initialisation warning
    assert "IMAGE_PRETRAINED is empty" not in log
