"""Figures read back from a training run's log: validation results and when they came, the step time.

Every line a run prints starts with its time (``2026-12-01 21:40:34,123 ...``, :mod:`common.runtime.logs`). The
training loop logs ``PROGRESS: 0.00%`` right before its first step (:mod:`common.trainer`); each epoch's
validation is one line, ``Epoch[E] \\tVal-Acc=0.988000,\\tLoss=0.310000,\\t`` (the first name carries
``Val-``; :mod:`common.hooks.validation_monitor`); at the end comes ``Training summary: ... T s per
optimizer step ...`` (:mod:`common.hooks.summary`).
"""
import datetime
import re
from typing import List, NamedTuple, Optional

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")
_VAL = re.compile(r"Epoch\[(\d+)\] \tVal-(.*)$")
_PER_STEP = re.compile(r"Training summary: .*?; ([0-9.]+|nan) s per optimizer step")


class Validation(NamedTuple):
    """One epoch-end validation: 0-based ``epoch``, ``metrics`` (name -> value, ``Acc`` for ``Val-Acc``),
    ``seconds`` since the training loop started (the first ``PROGRESS`` line; None when absent)."""
    epoch: int
    metrics: dict
    seconds: Optional[float]


def stamped_lines(text):
    """``[(datetime, message), ...]`` of the log's lines that start with a time stamp."""
    out = []
    for line in text.splitlines():
        m = _STAMP.match(line)
        if m:
            out.append((datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), m.group(2)))
    return out


def training_start(lines):
    """Time of the first ``PROGRESS:`` line (the training loop, right before its first step), or None."""
    return next((t for t, msg in lines if msg.startswith("PROGRESS:")), None)


def validations(text) -> List[Validation]:
    """The epoch-end validations of a log, in order (``Val-EMA-*`` lines are not among them)."""
    lines = stamped_lines(text)
    start = training_start(lines)
    out = []
    for t, msg in lines:
        m = _VAL.search(msg)
        if m and not m.group(2).startswith("EMA-"):
            metrics = {k: float(v) for k, v in re.findall(r"([\w-]+)=([-+0-9.e]+|nan|inf)", m.group(2))}
            out.append(Validation(int(m.group(1)), metrics, (t - start).total_seconds() if start else None))
    return out


def time_to(text, metric, target):
    """Seconds from the training loop's start to the first validation with ``metric >= target``, or None."""
    return next((v.seconds for v in validations(text) if v.metrics.get(metric, float("-inf")) >= target), None)


def seconds_per_step(text):
    """The ``s per optimizer step`` of the log's last training summary, or None."""
    found = _PER_STEP.findall(text)
    return float(found[-1]) if found else None
