"""Command line: flags, config errors without tracebacks, output folder with the effective config."""
import os
import re
import subprocess
import sys

import pytest

from common.cli import config_from_args, run_main, setup_output, train_argument_parser
from tests.conftest import ROOT
from tests.faults import harness, tiny_task
from vcr.task import TASK as VCR_TASK

FP16_CFG = os.path.join(ROOT, "cfgs", "vcr", "base_q2a_4x16G_fp16.yaml")


def test_reference_flags_and_opts():
    args = train_argument_parser("t").parse_args(
        ["--cfg", FP16_CFG, "--model-dir", "/runs", "--dist", "--local_rank", "3", "--do-test", "--cudnn-off",
         "--partial-pretrain", "p.model", "--opts", "TRAIN.LR", "1e-4", "TRAIN.GRAD_ACCUMULATE_STEPS", "8"])
    assert args.dist and args.do_test and args.cudnn_off and args.local_rank == 3
    cfg = config_from_args(args, VCR_TASK)
    assert cfg.OUTPUT_PATH == os.path.join("/runs", "./output/vl-bert/vcr")
    assert cfg.NETWORK.PARTIAL_PRETRAIN == "p.model"
    assert cfg.TRAIN.LR == 1e-4 and cfg.TRAIN.GRAD_ACCUMULATE_STEPS == 8 and cfg.TRAIN.FP16 is True
    assert cfg.is_frozen()
    assert train_argument_parser("t").parse_args(["--cfg", "c", "--local-rank=1"]).local_rank == 1


def test_output_folder_holds_a_loadable_effective_config(tmp_path):
    args = train_argument_parser("t").parse_args(["--cfg", FP16_CFG, "--model-dir", str(tmp_path),
                                                  "--opts", "TRAIN.END_EPOCH", "3"])
    cfg = config_from_args(args, VCR_TASK)
    folder, logger = setup_output(cfg, FP16_CFG)
    assert folder == os.path.join(str(tmp_path), "./output/vl-bert/vcr", "base_q2a_4x16G_fp16", "vcr1images_train")
    logger.info("hello")
    assert VCR_TASK.load_config(os.path.join(folder, "config.yaml")) == cfg
    logs = [f for f in os.listdir(folder) if f.endswith(".log")]
    assert len(logs) == 1 and "hello" in open(os.path.join(folder, logs[0])).read()


def test_config_mistake_exits_2_with_message_and_no_traceback(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "vcr", "train_end2end.py"), "--cfg", FP16_CFG,
           "--model-dir", str(tmp_path), "--opts", "TRAIN.GRAD_ACCULATE_STEPS", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: --opts: TRAIN.GRAD_ACCULATE_STEPS: no such key; "
                                   "did you mean TRAIN.GRAD_ACCUMULATE_STEPS?")


def test_paper_config_without_data_or_models_gives_one_message(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "vcr", "train_end2end.py"), "--cfg", FP16_CFG]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning: ")]  # GPUS, ...
    assert lines[0] == "error: the config names inputs that are not on this machine:"
    assert lines[1:5] == [
        "  DATASET.DATASET_PATH: data folder './data/vcr'",
        "  NETWORK.BERT_MODEL_NAME: BERT folder './model/pretrained_model/bert-base-uncased'",
        "  NETWORK.IMAGE_PRETRAINED: ResNet weights './model/pretrained_model/resnet101-pt-vgbua-0000.model'",
        "  NETWORK.PARTIAL_PRETRAIN: checkpoint './model/pretrained_model/vl-bert-base-e2e.model'"]
    assert "data/PREPARE_DATA.md" in lines[5] and "model/pretrained_model/PREPARE_PRETRAINED_MODELS.md" in lines[5]
    assert not os.path.exists(tmp_path / "output")  # nothing written before the check


def test_partial_pretrain_flag_for_a_task_without_the_key_is_one_error(tmp_path):
    """The tiny task (shared defaults only) has no NETWORK.PARTIAL_PRETRAIN: the flag names itself and the task."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("TRAIN:\n  END_EPOCH: 1\n")
    cmd = [sys.executable, os.path.join(ROOT, "tests", "faults", "tiny_task.py"), "--cfg", str(cfg),
           "--model-dir", str(tmp_path), "--partial-pretrain", "p.model"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: --partial-pretrain: task 'faults_tiny' loads no pretraining checkpoint "
                                   "(it declares no partial-pretrain key); drop the option")
    assert not os.path.exists(tmp_path / "output")


def test_unknown_key_is_never_offered_its_own_section(tmp_path, capsys):
    """``DATASET.NOPE`` has no close key: no suggestion (once it got "did you mean DATASET?"); a near name in the
    key's section, with its case changed too, or the same name in another section, is offered."""
    cfg = tiny_task.write_config(tmp_path)
    for key, message in (("DATASET.NOPE", "DATASET.NOPE: no such key"), ("TRAIN.NOPE", "TRAIN.NOPE: no such key"),
                         ("train.lr", "train: no such key; did you mean TRAIN?"),
                         ("TRAIN.lr", "TRAIN.lr: no such key; did you mean TRAIN.LR?"),
                         ("TRAIN.RNG_SEED", "TRAIN.RNG_SEED: no such key; did you mean RNG_SEED?")):
        assert harness.run_here(cfg, tmp_path, opts=[key, 1]) == 2
        assert capsys.readouterr().err == "error: --opts: {}\n".format(message)
    assert not os.path.exists(tmp_path / "output")


def test_wrong_argument_is_one_error_line(tmp_path, capsys):
    """A wrong training argument is a user error like a wrong key (one ``error:`` line, exit code 2, which a
    launcher says once for all ranks), not argparse's usage and message on each rank."""
    cfg = tiny_task.write_config(tmp_path)
    with pytest.raises(SystemExit) as e:
        run_main(lambda: tiny_task.main(["--cfg", cfg, "--model-dir", str(tmp_path), "--bogus", "1"]))
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert re.fullmatch(r"error: \S+: unrecognized arguments: --bogus 1 \(see --help\)\n", err), err
