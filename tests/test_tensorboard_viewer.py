"""The TensorBoard command the VCR demo prints (scripts/run_demo.sh) serves a tiny run's scalars: started on the
events of a run of vcr/train_end2end.py on a free loopback port, it answers ``/data/plugin/scalars/scalars``
with the steps and values the run wrote (read back by :func:`common.diagnostics.tb_events.read_scalars`), then stops."""
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from tests.conftest import ROOT
from tests.tiny_vcr import output_folder, tensorboard_scalars

START_TIMEOUT_S = 120  # import and first load of the event files; a few seconds on an idle machine
REQUEST_TIMEOUT_S = 10


def _printed_command(logdir):
    """The TensorBoard line of the demo's closing message, with ``$PY`` and ``$OUT`` filled in, as argv."""
    with open(os.path.join(ROOT, "scripts", "run_demo.sh")) as f:
        line = re.search(r"^\s*TensorBoard:\s+(.+)$", f.read(), re.M).group(1)
    assert line.endswith("--logdir $OUT/tensorboard_logs"), line  # the command alone, nothing to do first
    out = os.path.dirname(logdir)
    return [sys.executable if a == "$PY" else a.replace("$OUT", out) for a in shlex.split(line)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port, path, **query):
    url = "http://127.0.0.1:{}{}?{}".format(port, path, urllib.parse.urlencode(query))
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
        return json.loads(response.read())


def _wait_for_tags(server, port, log):
    """``{run: [scalar tag, ...]}`` once the server lists scalars (it loads the event files after it starts)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "tensorboard exited with {}:\n{}".format(server.returncode, log.read_text())
        try:
            tags = _get(port, "/data/plugin/scalars/tags")
            if any(tags.values()):
                return {run: sorted(t) for run, t in tags.items()}
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            pass  # not listening yet
        time.sleep(0.5)
    raise AssertionError("tensorboard listed no scalars within {} s:\n{}".format(START_TIMEOUT_S, log.read_text()))


def test_printed_tensorboard_command_serves_the_runs_scalars(tiny_init, tmp_path):
    model_dir, _ = tiny_init
    logdir = os.path.join(output_folder(model_dir), "tensorboard_logs")
    logged = tensorboard_scalars(model_dir)
    assert logged and all(logged.values())
    port, log = _free_port(), tmp_path / "tensorboard.log"
    env = dict(os.environ, HOME=str(tmp_path), TMPDIR=str(tmp_path))  # where TensorBoard keeps its instance files
    with open(log, "w") as output:
        server = subprocess.Popen(_printed_command(logdir) + ["--host", "127.0.0.1", "--port", str(port)],
                                  stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        tags = _wait_for_tags(server, port, log)
        assert tags == {".": sorted(logged)}  # the logdir itself is the one run
        for tag, points in logged.items():
            served = _get(port, "/data/plugin/scalars/scalars", tag=tag, run=".")  # [[wall time, step, value]]
            assert [(step, value) for _, step, value in served] == points, tag
    finally:
        server.terminate()
        try:
            server.wait(timeout=REQUEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
