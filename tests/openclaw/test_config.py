"""The config file as an admin meets it: defaults without a file, errors that say what to fix,
secrets that resolve but never show, and a starter file that loads."""

from __future__ import annotations

import os
import re
import stat
import textwrap
from pathlib import Path

import pytest

from openclaw.config import (
    AgentConfig,
    Config,
    ConfigError,
    RoleConfig,
    Secret,
    default_config_path,
    exposed_secrets,
    load_config,
    starter_config,
    write_starter_config,
)
from openclaw.config.problems import table_keys


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME, so the default paths never touch the real user's files."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("TELEGRAM_BOT_TOKEN", "DISCORD_BOT_TOKEN", "OPENCLAW_TEST_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return home


def write(tmp_path: Path, text: str, name: str = "openclaw.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.splitlines() == [f"{path}: {p}" for p in info.value.problems]
    return info.value.problems


def only_problem(path: Path) -> str:
    found = problems(path)
    assert len(found) == 1, found
    return found[0]


# --- defaults ----------------------------------------------------------------------------------


def test_missing_file_at_default_path_gives_defaults(home: Path):
    assert not default_config_path().exists()
    config = load_config()
    assert config.source is None
    assert config.engine.model is None and config.engine.max_num_seqs == 64
    assert config.agent.system_prompt == "You are OpenClaw, a helpful personal assistant."
    assert config.agent.max_steps == 8 and config.agent.reply_max_tokens == 512
    assert config.access.dm_policy == "pairing" and config.access.admins == []
    assert (config.admin.host, config.admin.port, config.admin.enabled) == ("127.0.0.1", 9477, True)
    assert not config.telegram.enabled and not config.discord.enabled
    assert config.skills.enabled == ["clock"]
    data_dir = home / ".local/share/openclaw"
    assert config.data_dir == data_dir
    assert config.store.url == f"sqlite+aiosqlite:///{data_dir}/openclaw.db"


def test_default_path_is_under_home_config(home: Path):
    assert default_config_path() == home / ".config/openclaw/openclaw.toml"


def test_file_at_default_path_is_read(home: Path):
    default_config_path().parent.mkdir(parents=True)
    default_config_path().write_text("[agent]\nmax_steps = 3\n")
    config = load_config()
    assert config.agent.max_steps == 3
    assert config.source == default_config_path()


def test_missing_file_at_explicit_path_is_an_error_that_says_how_to_make_that_file(home: Path):
    path = home / "my configs" / "nope.toml"
    # `openclaw init` alone would write the default path, not this one.
    assert only_problem(path) == f"file not found; create one with `openclaw init --config '{path}'`"
    assert only_problem(default_config_path()) == "file not found; create one with `openclaw init`"


def test_the_engine_table_is_the_engines_own_config_with_its_defaults():
    from engine.config import EngineConfig

    config = Config()
    assert type(config.engine) is EngineConfig and config.engine == EngineConfig()
    assert config.engine.max_num_seqs == 64 and config.engine.enable_prefix_caching


# --- a full valid file -------------------------------------------------------------------------


def test_full_valid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:telegram-secret")
    (tmp_path / "discord.token").write_text("discord-secret\n")
    path = write(tmp_path, """
        data_dir = "state"

        [engine]
        model = "~/models/qwen.gguf"
        device = "cuda:0"
        dtype = "bfloat16"
        max_num_seqs = 4
        kv_cache_gib = 2
        max_model_len = 8192

        [agent]
        system_prompt = "Be brief."
        max_steps = 4
        context_tokens = 4096
        temperature = 0
        tool_timeout_s = 30

        [store]
        url = "postgresql+asyncpg://claw:pw@localhost/claw"

        [access]
        admins = ["telegram:1001"]
        allow = ["discord:42", "terminal:local"]
        blocked = ["telegram:666"]
        dm_policy = "allowlist"
        roles = { "discord:42" = "family" }

        [admin]
        host = "::1"
        port = 0

        [telegram]
        enabled = true
        token = "env:TELEGRAM_BOT_TOKEN"
        base_url = "http://127.0.0.1:8081/bot"
        stream_edits = true

        [discord]
        enabled = true
        token = "file:discord.token"
        gateway_url = "ws://127.0.0.1:8082/"

        [sandbox]
        bwrap_path = "/usr/bin/bwrap"

        [skills]
        enabled = ["clock", "shell", "files"]
        dirs = ["skills", "/opt/skills"]

        [skills.shell]
        max_output_bytes = 65536

        [roles.family]
        skills = ["clock"]
        network = false
    """)
    config = load_config(path)
    assert config.source == path
    assert config.data_dir == tmp_path / "state"  # relative to the file's folder
    assert config.engine.model == str(Path.home() / "models/qwen.gguf")
    assert config.engine.device == "cuda:0" and config.engine.kv_cache_gib == 2.0
    assert config.agent.temperature == 0.0 and config.agent.context_tokens == 4096
    assert config.store.url == "postgresql+asyncpg://claw:pw@localhost/claw"
    assert config.access.dm_policy == "allowlist"
    assert config.admin.host == "::1" and config.admin.port == 0
    assert config.telegram.token == Secret("123:telegram-secret")
    assert config.telegram.token.get() == "123:telegram-secret" and config.telegram.token.source == "env"
    assert config.discord.token.get() == "discord-secret" and config.discord.token.source == "file"
    assert config.sandbox.bwrap_path == Path("/usr/bin/bwrap")
    assert config.skills.dirs == [tmp_path / "skills", Path("/opt/skills")]
    assert config.skills.settings == {"shell": {"max_output_bytes": 65536}}
    assert config.roles["family"].skills == ["clock"] and not config.roles["family"].network


def test_user_roles_default_by_admin_status_and_can_be_overridden(tmp_path: Path):
    path = write(tmp_path, """
        [access]
        admins = ["telegram:1", "telegram:2"]
        roles = { "telegram:2" = "operator", "discord:9" = "family" }
        [roles.operator]
        [roles.family]
    """)
    config = load_config(path)
    assert config.user_role("telegram:1") == "admin"
    assert config.user_role("telegram:2") == "operator"
    assert config.user_role("discord:9") == "family"
    assert config.user_role("terminal:local") == "admin"  # the console's owner
    assert config.user_role("telegram:3") == "user"


def test_relative_sqlite_url_is_pinned_to_the_config_folder(tmp_path: Path):
    path = write(tmp_path, '[store]\nurl = "sqlite+aiosqlite:///db/claw.db"\n')
    assert load_config(path).store.url == f"sqlite+aiosqlite:///{tmp_path}/db/claw.db"


def test_dump_validates_back_to_the_same_config(tmp_path: Path):
    path = write(tmp_path, """
        [access]
        admins = ["telegram:1"]
        [skills]
        dirs = ["skills"]
        [skills.shell]
        max_output_bytes = 10
    """)
    config = load_config(path)
    assert Config.model_validate(config.model_dump()).model_dump() == config.model_dump()
    assert Config.model_validate_json(config.model_dump_json()).model_dump() == config.model_dump()


# --- each class of error names the key, the value and what is expected --------------------------


def test_wrong_type_names_key_and_value(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[engine]\nmax_num_seqs = "lots"\n'))
    assert problem == 'engine.max_num_seqs = "lots": expected an integer'


def test_the_engine_table_is_checked_as_the_other_tables_are(tmp_path: Path):
    # [engine] is the engine's own dataclass, not a section model: the same wording all the same.
    assert only_problem(write(tmp_path, "[engine]\nmax_num_seq = 4\n")) == (
        'engine.max_num_seq = 4: unknown key in [engine]; did you mean "max_num_seqs"?')
    assert problems(write(tmp_path, '[engine]\nmodel = ""\ndtype = "float64"\nmax_model_len = 0\n')) == [
        'engine.model = "": expected a path (a non-empty string)',
        "engine.dtype = \"float64\": expected 'auto', 'float32', 'float16' or 'bfloat16'",
        "engine.max_model_len = 0: expected a number >= 1"]
    assert only_problem(write(tmp_path, 'engine = "cpu"\n')) == 'engine = "cpu": expected a table'
    config = load_config(write(tmp_path, '[engine]\nmodel = "models/m.gguf"\nenforce_eager = true\n'))
    assert config.engine.model == str(tmp_path / "models/m.gguf") and config.engine.enforce_eager


def test_a_string_where_a_list_goes_is_shown_as_the_list_of_one_it_meant(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[roles.fam]\nskills = "*"\n'))
    assert problem == 'roles.fam.skills = "*": expected a list (of one: ["*"])'


@pytest.mark.parametrize("key, granted, where", [
    ("read_only", "{tmp}/srv", "holds"),  # a parent of data_dir: the database, every workspace
    ("read_write", "{tmp}/srv/data/workspaces", "is inside"),
    ("read_only", "{tmp}/srv/data", "holds"),
])
def test_a_folder_granted_over_data_dir_is_refused(tmp_path: Path, key, granted, where):
    granted = granted.format(tmp=tmp_path)
    problem = only_problem(write(tmp_path, f'data_dir = "{tmp_path}/srv/data"\n[roles.fam]\n'
                                           f'skills = ["files"]\n{key} = ["/usr/share", "{granted}"]\n'))
    assert problem.startswith(f"roles.fam.{key}[1]: {granted} {where} data_dir ({tmp_path}/srv/data")


def test_reading_the_mailbox_is_the_admins_unless_a_role_is_granted_it(tmp_path: Path):
    policy = load_config(write(tmp_path, '[roles.family]\nskills = ["email"]\nemail_read = true\n'
                                         '[roles.admin]\nnetwork = false\n')).policy()
    assert policy.role("family").email_read and policy.role("admin").email_read  # kept
    assert not policy.role("user").email_read


def test_a_data_dir_that_is_a_file_or_under_one_is_named(tmp_path: Path):
    (tmp_path / "notes").write_text("")
    assert only_problem(write(tmp_path, f'data_dir = "{tmp_path}/notes"\n')) == (
        f'data_dir = "{tmp_path}/notes": is a file, not a folder; name a folder (it is made if missing)')
    assert only_problem(write(tmp_path, f'data_dir = "{tmp_path}/notes/openclaw"\n')) == (
        f'data_dir = "{tmp_path}/notes/openclaw": is under {tmp_path}/notes, a file, not a folder; '
        "name a folder (it is made if missing)")
    # With a problem elsewhere too: the same report has both.
    both = problems(write(tmp_path, f'data_dir = "{tmp_path}/notes"\n[agent]\ntemperature = "hot"\n'))
    assert len(both) == 2 and any("is a file" in p for p in both)


def test_a_file_that_fails_validation_carries_the_config_its_valid_keys_make(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, """
            [agent]
            temperature = "hot"
            max_steps = 3
            [skills]
            enabled = ["clock", 7]
        """))
    partial = info.value.partial  # what the checks after validation look at
    assert partial.agent.max_steps == 3 and partial.agent.temperature == AgentConfig().temperature
    assert partial.skills.enabled == ["clock"]


def test_a_folder_granted_beside_data_dir_is_fine(tmp_path: Path):
    path = write(tmp_path, f'data_dir = "{tmp_path}/srv/data"\n[roles.fam]\nskills = ["files"]\n'
                           f'read_only = ["{tmp_path}/srv/media", "{tmp_path}/srv/database"]\n')
    assert load_config(path).roles["fam"].read_only[1] == tmp_path / "srv/database"


def test_strings_are_not_numbers_even_when_they_look_like_one(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[admin]\nport = "9477"\n'))
    assert problem == 'admin.port = "9477": expected an integer'


def test_out_of_range_number(tmp_path: Path):
    problem = only_problem(write(tmp_path, "[engine]\ngpu_memory_utilization = 1.5\n"))
    assert problem == "engine.gpu_memory_utilization = 1.5: expected a number <= 1.0"


def test_unknown_key_typo_suggests_the_real_key(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[access]\ndm_polcy = "open"\n'))
    assert problem == 'access.dm_polcy = "open": unknown key in [access]; did you mean "dm_policy"?'


def test_unknown_section_and_unknown_skills_key_are_caught(tmp_path: Path):
    found = problems(write(tmp_path, '[skills]\nenabeld = ["shell"]\n[telegarm]\nenabled = true\n'))
    assert 'skills.enabeld = ["shell"]: unknown key in [skills]; did you mean "enabled"?' in found
    assert 'telegarm = a table: unknown key at the top level; did you mean "telegram"?' in found


def test_bad_enum_lists_the_choices(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[access]\ndm_policy = "opne"\n'))
    assert problem.startswith('access.dm_policy = "opne": expected ')
    for choice in ("pairing", "allowlist", "open"):
        assert f"'{choice}'" in problem


@pytest.mark.parametrize(
    ("user", "hint"),
    [
        ("bob", 'expected a user "channel:id"'),
        ("telegram:@bob", "numeric id"),
        ("telgram:1001", 'did you mean "telegram"?'),
        ("discord:", 'expected a user "channel:id"'),
    ],
)
def test_bad_user_name_says_what_a_user_looks_like(tmp_path: Path, user: str, hint: str):
    problem = only_problem(write(tmp_path, f'[access]\nallow = ["terminal:local", "{user}"]\n'))
    assert problem.startswith(f'access.allow[1] = "{user}": ')
    assert hint in problem


def test_bad_user_name_as_a_roles_key(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[access]\nroles = { "bob" = "admin" }\n'))
    assert problem.startswith('access.roles.bob = "bob": expected a user "channel:id"')


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('admins = ["terminal:bob"]', "access.admins[0]"),
        ('allow = ["terminal:local", "terminal:bob"]', "access.allow[1]"),
        ('blocked = ["terminal:bob"]', "access.blocked[0]"),
        # Only the user is reported, not also its role "dev" as undefined.
        ('roles = { "terminal:bob" = "dev" }', 'access.roles."terminal:bob"'),
    ],
)
def test_a_terminal_user_other_than_the_console_is_refused_naming_the_key(tmp_path: Path, line: str,
                                                                           key: str):
    # The terminal connector only ever sees terminal:local: "terminal:bob" would match no one.
    problem = only_problem(write(tmp_path, f"[access]\n{line}\n"))
    assert problem.startswith(f'{key} = "terminal:bob": the terminal has one user, "terminal:local" '
                              "(the console's owner)"), problem
    assert '"telegram:ID" or "discord:ID"' in problem  # what to write instead


def test_the_consoles_owner_may_be_named_anywhere_a_user_is(tmp_path: Path):
    config = load_config(write(tmp_path, '''
        [access]
        admins = ["terminal:local"]
        allow = ["terminal:local"]
        roles = { "terminal:local" = "family" }
        [roles.family]
        skills = ["clock"]
        '''))
    assert config.access.admins == config.access.allow == ["terminal:local"]
    assert config.user_role("terminal:local") == "family"


@pytest.mark.parametrize("listed", ["admins", "allow"])
def test_a_user_let_in_cannot_also_be_blocked(tmp_path: Path, listed):
    problem = only_problem(write(tmp_path, f'[access]\n{listed} = ["telegram:1"]\n'
                                           'blocked = ["telegram:1"]\n'))
    assert problem.startswith('access.blocked = ["telegram:1"]: ')
    assert f"both in access.{listed} and blocked" in problem


def test_the_consoles_owner_cannot_be_blocked(tmp_path: Path):
    # The console is always let in: such an entry would change nothing, silently.
    problem = only_problem(write(tmp_path, '[access]\nblocked = ["telegram:1", "terminal:local"]\n'))
    assert problem.startswith('access.blocked = ["telegram:1", "terminal:local"]: ')
    assert "never shut out of their own terminal" in problem


def test_non_loopback_admin_host_is_refused_unless_allowed(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[admin]\nhost = "0.0.0.0"\n'))
    assert problem.startswith('admin.host = "0.0.0.0": the admin port must stay on loopback')
    assert "allow_remote = true" in problem
    config = load_config(write(tmp_path, '[admin]\nhost = "0.0.0.0"\nallow_remote = true\n'))
    assert config.admin.host == "0.0.0.0"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_admin_hosts_are_fine(tmp_path: Path, host: str):
    assert load_config(write(tmp_path, f'[admin]\nhost = "{host}"\n')).admin.host == host


def test_enabled_connector_without_token_names_the_key(tmp_path: Path):
    found = problems(write(tmp_path, "[telegram]\nenabled = true\n[discord]\nenabled = true\n"))
    assert found == [
        'telegram.token: required when telegram.enabled = true, e.g. token = "env:TELEGRAM_BOT_TOKEN"',
        'discord.token: required when discord.enabled = true, e.g. token = "env:DISCORD_BOT_TOKEN"',
    ]


def test_missing_env_secret_names_key_and_variable(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[telegram]\ntoken = "env:OPENCLAW_TEST_TOKEN"\n'))
    assert problem.startswith('telegram.token = "env:OPENCLAW_TEST_TOKEN": ')
    assert "environment variable OPENCLAW_TEST_TOKEN is not set" in problem


def test_unreadable_secret_file_names_key_and_path(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[discord]\ntoken = "file:missing.token"\n'))
    assert problem.startswith('discord.token = "file:missing.token": cannot read secret file ')
    assert str(tmp_path / "missing.token") in problem


def test_empty_secret_is_an_error(tmp_path: Path):
    (tmp_path / "empty.token").write_text("\n")
    problem = only_problem(write(tmp_path, '[discord]\ntoken = "file:empty.token"\n'))
    assert problem == 'discord.token = "file:empty.token": the value is empty'


def test_malformed_literal_secret_is_not_echoed(tmp_path: Path):
    problem = only_problem(write(tmp_path, "[telegram]\ntoken = 123456789\n"))
    assert "123456789" not in problem
    assert problem.startswith("telegram.token = ***: expected a string")


def test_bad_store_scheme_is_explained_without_the_password(tmp_path: Path):
    problem = only_problem(write(tmp_path, '[store]\nurl = "postgresql://claw:hunter2@db/claw"\n'))
    assert "hunter2" not in problem
    assert 'expected "postgresql+asyncpg://' in problem
    problem = only_problem(write(tmp_path, '[store]\nurl = "mysql://db/claw"\n'))
    assert problem == ('store.url = "mysql://db/claw": expected a URL starting with '
                       '"sqlite+aiosqlite://" or "postgresql+asyncpg://"')


def test_a_secret_under_a_mistyped_key_is_not_echoed(tmp_path: Path):
    # The error goes to the journal (`openclaw run`), doctor's output and `openclaw reload`.
    found = problems(write(tmp_path, """
        [telegram]
        tokne = "123456:AAH-VERY-SECRET"
        [skills]
        smtp_password = "mail-VERY-SECRET"
        [skills.email]
        api_key = "ok"
        [agent]
        max_step = 3
    """))
    assert not [p for p in found if "VERY-SECRET" in p], found
    assert 'telegram.tokne = ***: unknown key in [telegram]; did you mean "token"?' in found
    assert any(p.startswith("skills.smtp_password = ***: unknown key in [skills]") for p in found)
    # Values that cannot be credentials are still shown: they help find the line.
    assert 'agent.max_step = 3: unknown key in [agent]; did you mean "max_steps"?' in found


def test_a_store_password_with_a_slash_is_masked_in_errors_reprs_and_dumps(tmp_path: Path):
    # SQLAlchemy reads everything up to the "@" as the password, "/" included.
    problem = only_problem(write(tmp_path, '[store]\nurl = "postgresql://claw:pw/VERY-SECRET@db/claw"\n'))
    assert "VERY-SECRET" not in problem, problem
    config = load_config(write(tmp_path, """
        [store]
        url = "postgresql+asyncpg://claw:pw/VERY-SECRET@localhost/claw"
    """))
    assert config.store.url.endswith(":pw/VERY-SECRET@localhost/claw")  # the store needs it
    for shown in (repr(config), str(config.store), config.model_dump_json()):
        assert "VERY-SECRET" not in shown, shown


def test_toml_syntax_error_names_the_line(tmp_path: Path):
    path = write(tmp_path, '[agent]\nmax_steps = 3\nsystem_prompt = "unterminated\n')
    problem = only_problem(path)
    assert re.match(r"line 3, column \d+: invalid TOML: ", problem), problem


def test_several_errors_are_reported_together(tmp_path: Path):
    found = problems(write(tmp_path, """
        [engine]
        device = "gpu"
        [agent]
        max_steps = 0
        [access]
        dm_policy = "everyone"
        [admin]
        hots = "127.0.0.1"
    """))
    assert [p.split(" = ")[0] for p in found] == [
        "engine.device", "agent.max_steps", "access.dm_policy", "admin.hots",
    ]
    assert found[0] == 'engine.device = "gpu": expected "auto", "cpu", "cuda" or "cuda:N"'
    assert found[1] == "agent.max_steps = 0: expected a number >= 1"


def test_an_unknown_key_in_a_role_table_suggests_the_real_key(tmp_path: Path):
    problem = only_problem(write(tmp_path, "[roles.family]\nnetwrok = true\n"))
    assert problem == 'roles.family.netwrok = true: unknown key in [roles.family]; did you mean "network"?'


def test_every_check_across_sections_is_reported_not_only_the_first(tmp_path: Path):
    found = problems(write(tmp_path, f"""
        data_dir = "{tmp_path}/data"
        [access]
        roles = {{ "telegram:5" = "famly", "telegram:6" = "frends" }}
        [roles.fam]
        read_write = ["{tmp_path}/data/workspaces"]
    """))
    assert [p.split(":")[0] for p in found] == ["access.roles", "access.roles", "roles.fam.read_write[0]"]
    assert 'telegram:5 has the role "famly"' in found[0] and 'telegram:6 has the role "frends"' in found[1]


def test_the_file_example_of_every_kind_of_mistake_is_reported_in_one_go(tmp_path: Path):
    found = problems(write(tmp_path, f"""
        data_dir = "{tmp_path}/data"
        [agent]
        max_step = 3
        [acess]
        admins = ["telegram:1"]
        [access]
        dm_policy = "opne"
        roles = {{ "telegram:5" = "famly", "telegram:6" = "family", "bob" = "ghost" }}
        [roles.family]
        skills = ["clock"]
        netwrok = true
        [roles.kids]
        read_only = ["{tmp_path}"]
    """))
    assert found == [
        'agent.max_step = 3: unknown key in [agent]; did you mean "max_steps"?',
        "access.dm_policy = \"opne\": expected 'pairing', 'allowlist' or 'open'",
        'access.roles.bob = "bob": expected a user "channel:id", e.g. "telegram:1001", "discord:42" or '
        '"terminal:local"',
        'roles.family.netwrok = true: unknown key in [roles.family]; did you mean "network"?',
        'acess = a table: unknown key at the top level; did you mean "access"?',
        # Checked although the sections above failed; "family" is defined though its table has a
        # typo, and "bob" is reported once, as a user.
        'access.roles: telegram:5 has the role "famly", which is not defined; add a [roles.famly] '
        "table or use one of: admin, family, kids, user",
        f"roles.kids.read_only[0]: {tmp_path} holds data_dir ({tmp_path}/data: the database and every "
        "user's workspace); grant a folder beside it",
    ]


# --- secrets never show ------------------------------------------------------------------------


def test_secrets_resolve_but_never_show_in_repr_or_dumps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "tg-VERY-SECRET")
    (tmp_path / "dc").write_text("  dc-VERY-SECRET  \n")
    path = write(tmp_path, """
        [store]
        url = "postgresql+asyncpg://claw:pg-VERY-SECRET@localhost/claw"
        [telegram]
        enabled = true
        token = "env:TELEGRAM_BOT_TOKEN"
        [discord]
        enabled = true
        token = "file:dc"
        [skills.email]
        smtp_password = "mail-VERY-SECRET"
    """)
    config = load_config(path)
    assert config.telegram.token.get() == "tg-VERY-SECRET"
    assert config.discord.token.get() == "dc-VERY-SECRET"  # stripped
    assert "pg-VERY-SECRET" in config.store.url  # the store needs the real URL
    for shown in (repr(config), str(config), config.model_dump_json(), str(config.model_dump()),
                  str(config.telegram.token), repr(config.telegram.token), f"{config.discord.token}"):
        assert "VERY-SECRET" not in shown, shown
    assert config.model_dump()["telegram"]["token"] == "***"
    assert "***" in repr(config.telegram)


def test_literal_secret_is_allowed(tmp_path: Path):
    config = load_config(write(tmp_path, '[telegram]\nenabled = true\ntoken = "123:abc"\n'))
    assert config.telegram.token.get() == "123:abc" and config.telegram.token.source == "literal"


# --- the starter file --------------------------------------------------------------------------


def test_starter_config_loads_to_the_defaults(tmp_path: Path):
    config = load_config(write(tmp_path, starter_config()))
    assert config.model_dump() == Config().model_dump()


def test_starter_config_commented_defaults_are_the_real_defaults(tmp_path: Path):
    # `# key = value` lines claim to be the default: uncommenting them all must change nothing.
    text = re.sub(r"(?m)^# (\w+ = )", r"\1", starter_config())
    config = load_config(write(tmp_path, text))
    assert config.model_dump() == Config().model_dump()


def test_starter_config_documents_every_key():
    text = starter_config()
    sections = ("engine", "agent", "store", "access", "admin", "telegram", "discord", "sandbox", "skills",
                "memory", "traces")
    for section in sections:
        assert f"[{section}]" in text
        for key in table_keys(type(getattr(Config(), section))):
            assert re.search(rf"(?m)^#?( e\.g\.)? ?{key} = ", text), f"{section}.{key} undocumented"
    assert 'token = "env:TELEGRAM_BOT_TOKEN"' in text and 'token = "env:DISCORD_BOT_TOKEN"' in text
    assert "[roles." in text


def test_starter_config_shows_every_role_key_and_data_dir():
    # The README promises that `openclaw init` writes every key: a role's limits, folders,
    # recipients and approval timeout are keys an admin looks for there too.
    text = starter_config()
    assert re.search(r"(?m)^# data_dir = ", text)
    roles = text[text.index("# [roles."):]
    for key in RoleConfig.model_fields:
        assert re.search(rf"(?m)^# e\.g\. {key} = ", roles), f"roles.NAME.{key} undocumented"


def test_write_starter_config_creates_a_private_file_and_refuses_to_overwrite(tmp_path: Path):
    path = tmp_path / "deep" / "dir" / "openclaw.toml"
    assert write_starter_config(path) == path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() == starter_config()
    load_config(path)

    path.write_text("# my edits\n")
    with pytest.raises(FileExistsError, match="already exists"):
        write_starter_config(path)
    assert path.read_text() == "# my edits\n"

    os.chmod(path, 0o644)
    write_starter_config(path, force=True)
    assert path.read_text() == starter_config()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # The edited file is kept, as privately as a config is; no temp file left.
    assert sorted(p.name for p in path.parent.iterdir()) == ["openclaw.toml", "openclaw.toml.bak"]
    assert (path.parent / "openclaw.toml.bak").read_text() == "# my edits\n"
    assert stat.S_IMODE(os.stat(path.parent / "openclaw.toml.bak").st_mode) == 0o600
    write_starter_config(path, force=True)  # again: the starter is no copy worth keeping
    assert (path.parent / "openclaw.toml.bak").read_text() == "# my edits\n"


def test_write_starter_config_defaults_to_the_default_path():
    path = write_starter_config()
    assert path == default_config_path()
    assert load_config().source == path


def test_world_readable_file_with_a_literal_token_is_warned_about(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture):
    path = write(tmp_path, '[telegram]\ntoken = "123:abc"\n[store]\n'
                           'url = "postgresql+asyncpg://bot:pg-Secret@localhost/openclaw"\n'
                           '[skills]\nenabled = ["email"]\n[skills.email]\nsmtp_password = "s3cret"\n'
                           'imap_password = "env:IMAP_PASSWORD"\n')
    os.chmod(path, 0o644)
    load_config(path)
    assert "chmod 600" in caplog.text and "123:abc" not in caplog.text
    assert "(telegram.token, skills.email.smtp_password, store.url (a password))" in caplog.text
    assert "s3cret" not in caplog.text and "pg-Secret" not in caplog.text
    caplog.clear()
    os.chmod(path, 0o600)
    load_config(path)
    assert caplog.text == ""


def test_a_readable_file_naming_its_store_password_by_reference_is_not_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch):
    # The password is in the service's environment, or a file of its own; this file has none.
    monkeypatch.setenv("OPENCLAW_TEST_TOKEN", "postgresql+asyncpg://bot:pg-Secret@localhost/oc")
    (tmp_path / "db-url").write_text("postgresql+asyncpg://bot:pg-Secret@localhost/oc\n")
    (tmp_path / "db-url").chmod(0o600)
    for reference in ("env:OPENCLAW_TEST_TOKEN", "file:db-url"):
        path = write(tmp_path, f'[store]\nurl = "{reference}"\n')
        os.chmod(path, 0o644)
        config = load_config(path)
        assert exposed_secrets(config, path) == [] and caplog.text == "", reference
    # Written in the file, even one SQLAlchemy reads with a "/" in it, it is said.
    path = write(tmp_path, '[store]\nurl = "postgresql+asyncpg://bot:pg/Secret@localhost/oc"\n')
    os.chmod(path, 0o644)
    assert exposed_secrets(load_config(path), path) == ["store.url (a password)"]


def test_a_role_workspace_is_per_user_and_relative_to_the_file(tmp_path: Path):
    config = load_config(write(tmp_path, '[roles.team]\nworkspace = "spaces/{user}"\n'))
    assert config.roles["team"].workspace == f"{tmp_path}/spaces/{{user}}"
    assert config.policy().workspace_path("telegram:5", config.policy().role("team")) == \
        tmp_path / "spaces/telegram-5"
    problem = only_problem(write(tmp_path, '[roles.team]\nworkspace = "/srv/shared"\n'))
    assert problem.startswith('roles.team.workspace = "/srv/shared": must contain "{user}"')


# --- disk: the workspace quota and the free-space reserve --------------------------------------


def test_disk_quota_and_reserve_flow_into_roles_and_sandbox_with_the_builtin_defaults(tmp_path: Path):
    from openclaw.skillset import sandbox_for

    defaults = Config().policy()
    assert defaults.role("user").limits.disk_bytes == 1024 << 20
    assert defaults.role("admin").limits.disk_bytes == 0  # no quota: often a real home folder
    assert sandbox_for(Config()).min_free_disk_bytes == 1024 << 20
    config = load_config(write(tmp_path, """
        [sandbox]
        min_free_disk_mb = 0
        [roles.admin]
        cpu_seconds = 60
        [roles.user]
        disk_mb = 200
        [roles.family]
        skills = ["clock"]
        [roles.unlimited]
        disk_mb = 0
    """))
    policy = config.policy()
    admin, user = policy.role("admin").limits, policy.role("user").limits
    assert (admin.disk_bytes, admin.cpu_seconds, admin.wall_seconds) == (0, 60, 300)  # the rest kept
    assert (user.disk_bytes, user.file_size_bytes) == (200 << 20, 64 << 20)
    assert policy.role("family").limits.disk_bytes == 1024 << 20  # a new role: the key's default
    assert policy.role("unlimited").limits.disk_bytes == 0
    sandbox = sandbox_for(config)
    assert sandbox.min_free_disk_bytes == 0 and sandbox.data_dir == config.data_dir
    admin_quota = load_config(write(tmp_path, "[roles.admin]\ndisk_mb = 500\n")).policy().role("admin")
    assert (admin_quota.limits.disk_bytes, admin_quota.limits.cpu_seconds) == (500 << 20, 120)


@pytest.mark.parametrize("text, expected", [
    ("[sandbox]\nmin_free_disk_mb = -1\n", "sandbox.min_free_disk_mb = -1: expected a number >= 0"),
    ('[sandbox]\nmin_free_disk_mb = "1G"\n', 'sandbox.min_free_disk_mb = "1G": expected an integer'),
    ("[roles.fam]\ndisk_mb = -5\n", "roles.fam.disk_mb = -5: expected a number >= 0"),
    ("[roles.fam]\ndisk_mb = 1.5\n", "roles.fam.disk_mb = 1.5: expected an integer"),
])
def test_a_malformed_disk_setting_names_the_key(tmp_path: Path, text: str, expected: str):
    assert only_problem(write(tmp_path, text)) == expected
