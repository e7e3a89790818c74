"""Configuration: shared defaults, legacy conversion (:mod:`.compat`), checked YAML / ``--opts`` merge,
value ranges (:mod:`.values`)."""
from .defaults import common_defaults  # noqa: F401
from .loader import (ConfigError, ConfigValueError, build_config, check_values, dump_config,  # noqa: F401
                     merge_dict, merge_file, merge_opts, read_yaml, reference_api, to_plain)
from .values import Rule, task_rules  # noqa: F401
