"""common.runtime.logs: one logger tree for the console and the run's log file."""
import logging
import warnings

import pytest

from common.runtime.logs import NAME, WARNINGS, get_logger, setup_run_logging, start_logging


@pytest.fixture(autouse=True)
def detach_handlers():
    """Take this test's handlers (bound to its captured stdout) off the loggers afterwards."""
    yield
    for logger in (logging.getLogger(NAME), logging.getLogger(WARNINGS), logging.getLogger()):
        for handler in [h for h in logger.handlers if getattr(h, "_vlbert", False)]:
            logger.removeHandler(handler)


def test_lines_before_and_after_the_log_file_opens_all_reach_it(tmp_path, capsys):
    start_logging()
    get_logger("test").info("before the file")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a config warning")
        log_file = tmp_path / "run.log"
        setup_run_logging(str(log_file))
        get_logger("test").info("after the file")
        logging.getLogger("some.library").warning("a library warning")
        logging.getLogger("some.library").info("library chatter")
    lines = [line.split(" ", 2)[2] for line in log_file.read_text().splitlines() if line[:2] == "20"]
    assert lines[0] == "before the file"
    assert lines[1].endswith("UserWarning: a config warning")
    assert lines[2:] == ["after the file", "a library warning"]
    printed = capsys.readouterr().out
    assert all(text in printed for text in ("before the file", "a config warning", "after the file",
                                            "a library warning")) and "library chatter" not in printed


def test_other_ranks_print_warnings_only(capsys):
    setup_run_logging(None, rank=1)
    get_logger("test").info("progress")
    get_logger("test").warning("trouble")
    out = capsys.readouterr().out
    assert "trouble" in out and "progress" not in out
