"""Weights & Biases: a run per training run, continued across resumes (its id saved), offline unless
``WANDB_MODE`` says otherwise (``wandb sync`` uploads it later). Imported only when ``REPORT_TO`` holds 'wandb'."""
import os
import shutil

from common.trackers.base import TrackerHook

STEP = "trainer/step"  # the x of every figure: TensorBoard's step (W&B's own _step counts log calls)


class WandbTracker(TrackerHook):
    """See :class:`common.trackers.base.TrackerHook`. Project: the config file's name; run name: the run
    folder's; files under ``<run folder>/wandb``; config: the effective config, flattened, and ``run.json``'s
    tags (``run/<tag>``); figures against :data:`STEP`; artifacts copied into the run's files."""
    name = "wandb"

    def __init__(self, *args):
        super().__init__(*args)
        self.mode = os.environ.get("WANDB_MODE", "offline")
        self.run = None

    def where(self):
        return "W&B ({}, {})".format(self.mode, os.path.join(self.folder, "wandb"))

    def start(self, run_id, params, tags):
        import wandb

        config = dict(params, **{"run/" + k: v for k, v in tags.items()})
        self.run = wandb.init(project=self.experiment, name=os.path.basename(os.path.normpath(self.folder)),
                              id=run_id, resume="allow", dir=self.folder, mode=self.mode,
                              settings=wandb.Settings(init_timeout=30, console="off"))
        self.run.config.update(config, allow_val_change=True)  # a resumed run: this launch's config
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        return self.run.id

    def log_metrics(self, step, scalars):
        self.run.log(dict(scalars, **{STEP: step}))

    def log_artifacts(self, paths):
        for path in paths:  # a copy in the run's files folder: uploaded as they are now (wandb sync, online)
            if path and os.path.isfile(path):
                shutil.copyfile(path, os.path.join(self.run.dir, os.path.basename(path)))

    def finish(self):
        self.run.finish()
