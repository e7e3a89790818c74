"""Errors that report a user's mistake (config, data, model files): scripts print them, no traceback."""


class UserInputError(ValueError):
    """Bad input from the user; the message names the file, line or key and what was expected."""


class CheckpointError(RuntimeError):
    """A file that is not a usable checkpoint, or a state dict that does not fit the model."""


class ExportRefused(UserInputError):
    """The task (or this config of it) has no ONNX graph; the message names the task and says why."""

    def __init__(self, task, reason):
        super().__init__("task '{}' cannot be exported to ONNX: {}".format(task, reason))
