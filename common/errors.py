"""Errors that report a user's mistake (config, data, model files): scripts print them, no traceback."""


class UserInputError(ValueError):
    """Bad input from the user; the message names the file, line or key and what was expected."""
