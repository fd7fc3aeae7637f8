"""The daemon's one config file: TOML, validated by pydantic, every problem reported at once.

`load_config(path)` reads the file and returns a `Config`; anything wrong raises `ConfigError`,
whose message has one line per problem naming the file, the dotted key, the value found and what
is expected, so the daemon can refuse to start with a message the admin can act on. A first run
needs no file: a missing file at the default path means all defaults. `starter_config()` is the
commented file `openclaw init` writes.

secrets.py: env:/file: references and Secret; fields.py: shared value types; sections.py: the
tables; engine.py: `[engine]`, by backend (the local engine or a server); model.py: the root and
its checks across tables; problems.py: the wording of errors;
load.py: reading the file; starter.py + starter.toml: the file `openclaw init` writes.
"""

from openclaw.config.engine import EngineSection, OpenAIEngineConfig, model_file_problems
from openclaw.config.fields import CHANNELS, LOCAL_USER, validate_user
from openclaw.config.load import data_dir_of, default_config_path, exposed_secrets, load_config
from openclaw.config.model import Config, cross_reference_problems, default_data_dir
from openclaw.config.problems import ConfigError
from openclaw.config.secrets import Secret
from openclaw.config.sections import AgentConfig, RoleConfig
from openclaw.config.starter import backup_path, starter_config, write_starter_config

__all__ = [
    "CHANNELS",
    "LOCAL_USER",
    "AgentConfig",
    "Config",
    "ConfigError",
    "EngineSection",
    "OpenAIEngineConfig",
    "RoleConfig",
    "Secret",
    "backup_path",
    "cross_reference_problems",
    "data_dir_of",
    "default_config_path",
    "default_data_dir",
    "exposed_secrets",
    "load_config",
    "model_file_problems",
    "starter_config",
    "validate_user",
    "write_starter_config",
]
