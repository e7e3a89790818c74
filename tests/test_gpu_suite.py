"""bench/gpu_suite.sh: the table and JSON it writes, exit codes, per-step timeouts and ``--only`` on stubbed steps
(quick), the loss agreement rule on known numbers, and the whole ``--dry-run`` end to end (slow)."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_suite  # noqa: E402

SUITE = os.path.join(ROOT, "bench", "gpu_suite.sh")


def good(suite, row):
    row.figures = {"samples/s": 12.5, "ratio": "1.20|x"}


def bad(suite, row):
    suite.run([sys.executable, "-c", "import sys; print('error: the GPU melted'); sys.exit(3)"])


def slow(suite, row):
    suite.run([sys.executable, "-c", "import time; time.sleep(60)"])


STUBS = [gpu_suite.Step("good", "a stub", good, 5, 5, "bf16"),
         gpu_suite.Step("bad", "a failing stub", bad, 20, 20, "fp16"),
         gpu_suite.Step("slow", "a stub past its timeout", slow, 2, 2)]


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(gpu_suite, "steps", lambda: list(STUBS))


def rows_of(md):
    """Table cells of the gpu_suite.md text (header row first)."""
    lines = [l for l in md.splitlines() if l.startswith("| ") and not l.startswith("| ---")]
    return [[c.strip() for c in l.strip("|").split(" | ")] for l in lines]


def test_table_and_json_have_one_row_per_step_with_status_figures_and_reason(stubbed, tmp_path):
    code = gpu_suite.main(["--dry-run", "--out", str(tmp_path)])
    assert code == 1  # one step failed, one timed out
    md = (tmp_path / "gpu_suite.md").read_text()
    assert md.startswith("# GPU suite: dry run (CPU, tiny sizes), none (CPU)\n")
    table = rows_of(md)
    assert table[0] == ["step", "what", "precision", "status", "figures", "reason", "s"]
    assert [r[:4] for r in table[1:]] == [["good", "a stub", "bf16", "ok"],
                                          ["bad", "a failing stub", "fp32 (GPU: fp16)", "fail"],
                                          ["slow", "a stub past its timeout", "-", "fail"]]
    assert table[1][4:6] == ["samples/s 12.5; ratio 1.20/x", "-"]  # '|' kept out of the cells
    assert table[2][5].startswith("exit 3 of ") and table[2][5].endswith(": error: the GPU melted")
    assert table[3][5].startswith("timed out after 2 s (the step's timeout): ")
    assert float(table[3][6]) < 10  # killed at its 2 s, not after the 60 s sleep

    saved = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert saved["header"]["mode"] == "dry run (CPU, tiny sizes)"
    assert [(r["step"], r["status"]) for r in saved["rows"]] == [("good", "ok"), ("bad", "fail"), ("slow", "fail")]
    assert saved["rows"][0]["figures"] == {"samples/s": 12.5, "ratio": "1.20|x"}
    assert saved["rows"][1]["reason"] == table[2][5]


def test_only_reruns_the_named_steps_and_keeps_the_other_rows(stubbed, tmp_path, monkeypatch):
    assert gpu_suite.main(["--dry-run", "--out", str(tmp_path)]) == 1
    fixed = [STUBS[0], gpu_suite.Step("bad", "a failing stub", good, 5, 5, "fp16"),
             gpu_suite.Step("slow", "a stub past its timeout", good, 5, 5)]
    monkeypatch.setattr(gpu_suite, "steps", lambda: fixed)
    assert gpu_suite.main(["--dry-run", "--out", str(tmp_path), "--only", "bad,sl*"]) == 0
    saved = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert [(r["step"], r["status"], r["reason"]) for r in saved["rows"]] == [
        ("good", "ok", ""), ("bad", "ok", ""), ("slow", "ok", "")]


def test_an_unknown_step_is_one_error_line_and_exit_2(tmp_path):
    done = subprocess.run([SUITE, "--dry-run", "--out", str(tmp_path), "--only", "e2e-vcr-fp61"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: --only: no step matches 'e2e-vcr-fp61' (steps: env, inputs, agree-vcr-fp16, e2e-vcr-fp16,")
    assert not (tmp_path / "gpu_suite.md").exists()


def test_agreement_compares_the_steps_up_to_the_first_skip():
    losses = [(1, 1.3900), (3, 1.3800), (5, 1.3712), (7, 2.5)]
    reference = [(1, 1.3890), (3, 1.3810), (5, 1.3700), (7, 1.3600)]
    skipped = [(1, 0), (3, 0), (5, 1), (7, 1)]  # step 5 was skipped (after its loss): the runs part after it
    n, worst, tol = gpu_suite.agreement(losses, reference, skipped, "fp16")
    assert n == 3
    assert worst == pytest.approx(0.0012 / 1.37)
    assert tol == 8 * 2.0 ** -11


@pytest.mark.slow
def test_dry_run_runs_every_step_on_the_cpu(tmp_path):
    done = subprocess.run([SUITE, "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True, timeout=1500)
    saved = json.loads((tmp_path / "gpu_suite.json").read_text())
    status = {r["step"]: (r["status"], r["reason"]) for r in saved["rows"]}
    assert done.returncode == 0, status
    assert list(status) == [s.name for s in gpu_suite.steps()]
    rows = {r["step"]: r for r in saved["rows"]}
    for task in gpu_suite.TASKS:
        for precision in ("fp16", "bf16"):
            figures = rows["e2e-{}-{}".format(task, precision)]["figures"]
            applied, skipped = map(int, figures["steps applied/skipped"].split("/"))
            assert figures["resume"] == "+{} steps ({}/0)".format(applied, 2 * applied) and skipped == 0
    assert rows["agree-vcr-fp16"]["figures"]["steps compared"] == rows["agree-vcr-fp16"]["figures"]["of"] == 4
    assert rows["vit-bf16"]["figures"]["bf16/fp32 optimizer state"] == 0.5
    assert rows["sdpa"]["figures"]["vit bf16 ran"] == "flash (CPU)"
    assert len(rows_of((tmp_path / "gpu_suite.md").read_text())) == 1 + len(status)
