"""Configuration: shared defaults, legacy conversion (:mod:`.compat`), checked YAML / ``--opts`` merge."""
from .loader import (ConfigError, TaskConfig, common_defaults, dump_config, merge_dict, merge_file,  # noqa: F401
                     merge_opts, read_yaml, task_api, to_plain)
