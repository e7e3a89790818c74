"""Configuration: shared defaults, legacy conversion (:mod:`.compat`), checked YAML / ``--opts`` merge."""
from .defaults import common_defaults  # noqa: F401
from .loader import (ConfigError, TaskConfig, dump_config, merge_dict, merge_file,  # noqa: F401
                     merge_opts, read_yaml, task_api, to_plain)
