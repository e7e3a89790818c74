"""A user mistake that the ranks of a launched job report: said once by the launcher, not once per rank.

The launchers (``scripts/dist_run_single.sh`` and ``dist_run_multi.sh`` through ``scripts/torchrun.py``,
``scripts/dist_run_slurm.sh``) set the environment variable :data:`ENV` to an empty folder that every rank
of the node (every rank of the job, for SLURM) can write to. :func:`common.cli.run_main` then writes a rank's
``error:`` lines into it (:func:`record`) instead of printing them; the launcher prints each distinct message
once (:func:`distinct_messages`) and exits with :data:`USER_ERROR_EXIT_CODE`. Without the variable (a script
run by hand, or by torchrun itself) each process prints its own lines.
"""
import os
from typing import List, Optional

ENV = "VLBERT_RANK_ERRORS"
USER_ERROR_EXIT_CODE = 2


def launch_rank(environ: Optional[dict] = None) -> int:
    """The process's rank in its launch before the process group exists: torchrun's ``RANK``, else SLURM's
    ``SLURM_PROCID``, else 0."""
    environ = os.environ if environ is None else environ
    return int(environ.get("RANK", environ.get("SLURM_PROCID", 0)))


def record(lines: List[str]) -> bool:
    """Write this rank's error ``lines`` (each a whole ``error: ...`` line) to the launcher's folder.

    Returns:
        True when written; False without a launcher folder, or when it cannot be written (then the
        caller prints the lines itself).
    """
    folder = os.environ.get(ENV)
    if not folder:
        return False
    try:
        with open(os.path.join(folder, "rank{:06d}".format(launch_rank())), "w") as f:
            f.write("".join(line + "\n" for line in lines))
    except OSError:
        return False
    return True


def distinct_messages(folder: str) -> List[str]:
    """The messages the ranks wrote to ``folder`` (each its ``error:`` lines, newline-ended), in rank order,
    each distinct text once; [] when none did (or the folder is gone)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    messages = []
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                text = f.read()
        except OSError:
            continue
        if text and text not in messages:
            messages.append(text)
    return messages
