"""`openclaw service install` as an admin meets it: a unit systemd accepts, hardened without
breaking bubblewrap or the GPU, written where systemd looks, never over an existing one by accident."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import warnings
from pathlib import Path

import pytest

from openclaw.cli.service import install_unit, unit_text


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME, so nothing is ever written to the real ~/.config/systemd."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SUDO_USER", raising=False)
    return home


@pytest.fixture
def openclaw_exe(tmp_path: Path) -> str:
    """An executable stand-in for the installed `openclaw` script (systemd-analyze checks it)."""
    exe = tmp_path / "bin" / "openclaw"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return str(exe)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of KEY=VALUE lines, as systemd reads them (keys may repeat, e.g. Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"line {number} is neither a section nor KEY=VALUE: {line!r}"
        assert key == key.strip() and key.isidentifier(), f"line {number}: odd key {key!r}"
        current.setdefault(key, []).append(value)
    return sections


def one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit[section].get(key, [])
    assert len(values) == 1, f"{key}= appears {len(values)} times in [{section}]"
    return values[0]


def test_user_unit_has_notify_restart_watchdog_and_run_command(tmp_path: Path) -> None:
    unit = parse_unit(unit_text("/usr/local/bin/openclaw", Path("/home/ann/.config/openclaw/openclaw.toml"),
                                None, Path("/home/ann/.local/share/openclaw")))
    assert list(unit) == ["Unit", "Service", "Install"]
    expected = {
        "Type": "notify", "NotifyAccess": "main",
        "ExecStart": "/usr/local/bin/openclaw run --config /home/ann/.config/openclaw/openclaw.toml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure", "RestartSec": "5", "WatchdogSec": "60", "TimeoutStopSec": "60",
        "KillSignal": "SIGTERM", "UMask": "0077",
        "ProtectSystem": "strict", "ReadWritePaths": "/home/ann/.local/share/openclaw",
        "ProtectHome": "read-only", "PrivateTmp": "yes", "ProtectKernelModules": "yes",
        "Delegate": "memory", "LockPersonality": "yes", "RestrictRealtime": "yes",
        "SystemCallArchitectures": "native",
    }
    for key, value in expected.items():
        assert one(unit, "Service", key) == value, key
    assert "PYTHONUNBUFFERED=1" in unit["Service"]["Environment"]
    assert "User" not in unit["Service"]
    assert one(unit, "Install", "WantedBy") == "default.target"


def test_system_unit_runs_as_the_given_user_and_starts_with_multi_user_target() -> None:
    unit = parse_unit(unit_text("/usr/bin/openclaw", Path("/etc/openclaw/openclaw.toml"), "openclaw",
                                Path("/var/lib/openclaw"), system=True))
    assert one(unit, "Service", "User") == "openclaw"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"
    assert one(unit, "Unit", "After") == "network-online.target"
    assert "PrivateUsers" not in unit["Service"]


def test_a_user_makes_it_a_system_unit_by_default_and_a_user_unit_refuses_one() -> None:
    unit = parse_unit(unit_text("/usr/bin/openclaw", Path("/c.toml"), "ann", Path("/var/lib/openclaw")))
    assert one(unit, "Install", "WantedBy") == "multi-user.target"
    with pytest.raises(ValueError, match="--system"):
        unit_text("/usr/bin/openclaw", Path("/c.toml"), "ann", Path("/d"), system=False)


def test_hardening_leaves_out_what_would_break_bubblewrap_or_the_gpu() -> None:
    text = unit_text("/usr/bin/openclaw", Path("/c.toml"), None, Path("/d"))
    service = parse_unit(text)["Service"]
    for key in ("NoNewPrivileges", "RestrictNamespaces", "SystemCallFilter", "ProtectKernelTunables",
                "RestrictSUIDSGID", "PrivateDevices", "DevicePolicy", "MemoryDenyWriteExecute"):
        assert key not in service, f"{key}= would stop bwrap sandboxes or the GPU"
        assert key in text  # ...and the unit says why it is absent


def test_user_unit_asks_for_private_users_so_older_systemd_applies_the_sandbox() -> None:
    unit = parse_unit(unit_text("/usr/bin/openclaw", Path("/c.toml"), None, Path("/d")))
    assert one(unit, "Service", "PrivateUsers") == "yes"


def test_the_unit_gives_the_daemon_a_hard_open_files_limit_to_raise_its_soft_one_to() -> None:
    # A flood of connections or many commands' pipes must not use up the usual 1024 descriptors;
    # the daemon raises its soft limit to this hard one itself (openclaw/descriptors.py).
    unit = parse_unit(unit_text("/usr/bin/openclaw", Path("/etc/openclaw.toml"), None, Path("/srv/oc")))
    assert one(unit, "Service", "LimitNOFILE") == "1024:65536"


def test_gpu_jit_caches_live_in_the_writable_data_dir() -> None:
    unit = parse_unit(unit_text("/usr/bin/openclaw", Path("/c.toml"), None, Path("/srv/oc")))
    environment = unit["Service"]["Environment"]
    assert "TRITON_CACHE_DIR=/srv/oc/cache/triton" in environment
    assert "CUDA_CACHE_PATH=/srv/oc/cache/cuda" in environment


def test_paths_with_spaces_percent_and_dollar_survive_unit_file_syntax(tmp_path: Path) -> None:
    exe = tmp_path / "my apps" / "openclaw"  # an existing file: its space is part of the path
    exe.parent.mkdir()
    exe.write_text("")
    unit = parse_unit(unit_text(str(exe), Path("/etc/oc/100% $HOME.toml"), None, Path("/data/open claw")))
    assert one(unit, "Service", "ExecStart") == f'"{exe}" run --config "/etc/oc/100%% $$HOME.toml"'
    assert one(unit, "Service", "ReadWritePaths") == '"/data/open claw"'
    assert '"TRITON_CACHE_DIR=/data/open claw/cache/triton"' in unit["Service"]["Environment"]


def test_a_command_prefix_is_kept_as_separate_words(tmp_path: Path) -> None:
    unit = parse_unit(unit_text("/usr/bin/python3 -m openclaw.cli", Path("/c.toml"), None, Path("/d")))
    assert one(unit, "Service", "ExecStart") == "/usr/bin/python3 -m openclaw.cli run --config /c.toml"


def test_a_newline_in_a_path_is_refused_rather_than_written_as_a_second_setting() -> None:
    with pytest.raises(ValueError, match="control character"):
        unit_text("/usr/bin/openclaw", Path("/c.toml\nExecStartPre=/bin/evil"), None, Path("/d"))


def test_install_writes_a_user_unit_under_home_and_says_how_to_enable_it(
        home: Path, tmp_path: Path, openclaw_exe: str) -> None:
    data_dir = home / ".local" / "share" / "openclaw"
    path, instructions = install_unit(openclaw_exe, home / ".config/openclaw/openclaw.toml", None, data_dir)
    assert path == home / ".config" / "systemd" / "user" / "openclaw.service"
    assert path.read_text() == unit_text(openclaw_exe, home / ".config/openclaw/openclaw.toml", None,
                                         data_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert data_dir.is_dir()  # ReadWritePaths= must exist before the service starts
    assert "systemctl --user daemon-reload && systemctl --user enable --now openclaw" in instructions
    assert "loginctl enable-linger $USER" in instructions
    _verify_with_systemd_analyze(path, user_unit=True, home=home)


def test_install_system_unit_runs_as_the_named_user(tmp_path: Path, openclaw_exe: str) -> None:
    unit_dir = tmp_path / "etc-systemd-system"
    data_dir = tmp_path / "var-lib-openclaw"
    user = _existing_user()
    path, instructions = install_unit(openclaw_exe, tmp_path / "openclaw.toml", user, data_dir,
                                      system=True, unit_dir=unit_dir)
    assert path == unit_dir / "openclaw.service"
    assert one(parse_unit(path.read_text()), "Service", "User") == user
    assert "systemctl daemon-reload && systemctl enable --now openclaw" in instructions
    assert f"install -d -m 0700 -o {user} {data_dir}" in instructions
    assert "--user" not in instructions
    _verify_with_systemd_analyze(path, user_unit=False, home=tmp_path)


def test_system_install_defaults_to_the_user_who_ran_sudo(tmp_path: Path, openclaw_exe: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "ann")
    path, _ = install_unit(openclaw_exe, tmp_path / "c.toml", None, tmp_path / "d", system=True,
                           unit_dir=tmp_path / "units")
    assert one(parse_unit(path.read_text()), "Service", "User") == "ann"


def test_install_refuses_to_overwrite_without_force(home: Path, tmp_path: Path, openclaw_exe: str) -> None:
    path, _ = install_unit(openclaw_exe, tmp_path / "a.toml", None, tmp_path / "data")
    path.write_text("# the admin's hand-edited unit\n")
    with pytest.raises(FileExistsError, match="--force"):
        install_unit(openclaw_exe, tmp_path / "b.toml", None, tmp_path / "data")
    assert path.read_text() == "# the admin's hand-edited unit\n"

    path, _ = install_unit(openclaw_exe, tmp_path / "b.toml", None, tmp_path / "data", force=True)
    assert f"--config {tmp_path / 'b.toml'}" in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["openclaw.service"]  # no temp file left


def test_install_user_unit_with_a_user_is_refused(tmp_path: Path, openclaw_exe: str) -> None:
    with pytest.raises(ValueError, match="--system"):
        install_unit(openclaw_exe, tmp_path / "c.toml", "ann", tmp_path / "d")


def _existing_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _verify_with_systemd_analyze(path: Path, *, user_unit: bool, home: Path) -> None:
    """`systemd-analyze verify` the unit where the tool exists; only this check is skipped otherwise."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        warnings.warn("systemd-analyze is not installed: the written unit was checked by this test's "
                      "parser only, not by `systemd-analyze verify`", stacklevel=2)
        return
    env = dict(os.environ)
    command = [analyze, "verify", str(path)]
    if user_unit:
        runtime = home / "run-user"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)  # the user manager's verify needs one
        command.insert(1, "--user")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    problems = [line for line in result.stderr.splitlines()
                if any(word in line for word in ("Unknown", "ignoring", "Failed", "not executable",
                                                 "Invalid", "bad", "unsafe", "not safe"))]
    assert result.returncode == 0 and not problems, result.stderr


def test_install_warns_of_a_config_or_data_dir_the_service_cannot_see(tmp_path, monkeypatch, capsys):
    import shutil
    import tempfile

    from openclaw.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))  # the user unit goes under it
    trial = Path(tempfile.mkdtemp(dir="/tmp"))  # where a quick trial's files often are
    try:
        config = trial / "c.toml"
        config.write_text(f'data_dir = "{trial / "data"}"\n')
        assert main(["--config", str(config), "service", "install"]) == 0
        err = capsys.readouterr().err
    finally:
        shutil.rmtree(trial)
    assert f"warning: the config file {config} is under /tmp" in err
    assert "data_dir" in err and "PrivateTmp=yes" in err


def _install_by_cli(command: list[str], home: Path, path_dirs: list[Path]) -> list[str]:
    """`openclaw service install` run as `command` (a real process) with this PATH; the words
    of the unit's ExecStart= as systemd splits them (its quoting is shell-like)."""
    import shlex
    import sys

    config = home / "c.toml"
    config.write_text(f'data_dir = "{home / "data"}"\n')
    env = {**os.environ, "HOME": str(home),
           "PATH": os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"])}
    env.pop("SUDO_USER", None)
    done = subprocess.run([*command, "--config", str(config), "service", "install"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=sys.prefix)
    assert done.returncode == 0, done.stderr
    unit = parse_unit((home / ".config/systemd/user/openclaw.service").read_text())
    return shlex.split(one(unit, "Service", "ExecStart"))


def test_the_unit_runs_this_openclaw_not_another_one_found_on_path(home: Path, tmp_path: Path,
                                                                    openclaw_exe: str) -> None:
    import sys

    # An older install (pipx, /usr/local) comes first on PATH; the admin ran the venv's script.
    script = Path(sys.prefix) / "bin" / "openclaw"
    words = _install_by_cli([str(script)], home, [Path(openclaw_exe).parent])
    assert words[:4] == [str(script), "run", "--config", str(home / "c.toml")]


def test_a_venv_path_with_a_space_stays_one_word_of_exec_start(home: Path, tmp_path: Path) -> None:
    import sys

    # `python -m openclaw.cli service install` from a venv whose path has a space, its `openclaw`
    # script not on PATH.
    venv = tmp_path / "my venv"
    venv.symlink_to(sys.prefix)
    python = venv / "bin" / Path(sys.executable).name
    words = _install_by_cli([str(python), "-m", "openclaw.cli"], home, [])
    assert words[:3] == [str(python), "-m", "openclaw.cli"], words
    assert Path(words[0]).is_file()


def test_a_config_mistake_stops_the_service_instead_of_restarting_it_every_few_seconds(
        tmp_path: Path, openclaw_exe: str) -> None:
    import sys

    # RestartSec=5 never trips systemd's default start limit (5 starts in 10 s): without this a
    # typo in the file restarts the daemon forever, the journal filling with the same error
    # (and a rejected bot token is tried again every 5 s).
    unit = parse_unit(unit_text(openclaw_exe, tmp_path / "c.toml", None, tmp_path / "d"))
    prevented = one(unit, "Service", "RestartPreventExitStatus").split()
    config = tmp_path / "c.toml"
    config.write_text('[agent]\nmax_steps = "8"\n')
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("NOTIFY_SOCKET", None)
    run = subprocess.run([sys.executable, "-m", "openclaw.cli", "run", "--config", str(config)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert "agent.max_steps" in run.stderr
    assert str(run.returncode) in prevented, (run.returncode, prevented)
    assert one(unit, "Service", "Restart") == "on-failure"  # a crash is still restarted


# --- a system unit, by the CLI: the service's user, their home, their view of the config ------


def _nobody() -> str:
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_name
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")


def _system_install(config: Path, user: str, units: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    from openclaw.cli import main

    monkeypatch.setattr("openclaw.cli.service.SYSTEM_UNIT_DIR", units)  # never /etc/systemd/system
    code = main(["--config", str(config), "service", "install", "--system", "--user", user])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_system_unit_keeps_data_dir_in_its_users_home_not_the_installers(
        tmp_path: Path, home: Path, monkeypatch, capsys) -> None:
    import pwd

    # `sudo openclaw service install --system --user NAME` with the starter file's default
    # data_dir: systemd gives the service NAME's HOME, so its daemon keeps its database under
    # ~NAME, and that is what ReadWritePaths= and the printed `install -d` must name, not root's.
    user = _nobody()
    their_home = Path(pwd.getpwnam(user).pw_dir)
    config = tmp_path / "openclaw.toml"
    config.write_text("[agent]\nmax_steps = 8\n")
    code, out, err = _system_install(config, user, tmp_path / "units", monkeypatch, capsys)
    assert code == 0, err
    expected = their_home / ".local" / "share" / "openclaw"
    unit = parse_unit((tmp_path / "units" / "openclaw.service").read_text())
    assert one(unit, "Service", "ReadWritePaths") == str(expected)
    assert f"install -d -m 0700 -o {user} {expected}" in out
    assert str(home) not in (tmp_path / "units" / "openclaw.service").read_text()

    config.write_text('data_dir = "~/agent"\n')  # "~" is the service's home too
    monkeypatch.setattr("openclaw.cli.service.SYSTEM_UNIT_DIR", tmp_path / "units2")
    code, out, err = _system_install(config, user, tmp_path / "units2", monkeypatch, capsys)
    assert code == 0, err
    unit = parse_unit((tmp_path / "units2" / "openclaw.service").read_text())
    assert one(unit, "Service", "ReadWritePaths") == str(their_home / "agent")


def test_a_system_unit_for_a_user_that_does_not_exist_is_refused(tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    config = tmp_path / "openclaw.toml"
    config.write_text("")
    code, _, err = _system_install(config, "no-such-user-oc", tmp_path / "units", monkeypatch, capsys)
    assert code == 1
    assert "there is no user no-such-user-oc" in err and "useradd" in err
    assert not (tmp_path / "units").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the file to another user (chown)")
def test_a_system_unit_says_when_its_user_cannot_read_the_config(tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    import tempfile

    from openclaw.config import write_starter_config

    # `sudo openclaw init --config /etc/openclaw/openclaw.toml` makes the file 0600 and its
    # folder 0700, root's: a service running as another user would stop at once on both.
    user = _nobody()
    trial = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path lies in a folder closed to them
    try:
        trial.chmod(0o755)
        config = write_starter_config(trial / "etc" / "openclaw" / "openclaw.toml")
        (trial / "etc").chmod(0o755)
        code, _, err = _system_install(config, user, tmp_path / "units", monkeypatch, capsys)
        assert code == 0
        assert f"{user}, who cannot read {config}: {config.parent} is closed to them" in err

        config.parent.chmod(0o755)
        monkeypatch.setattr("openclaw.cli.service.SYSTEM_UNIT_DIR", tmp_path / "units2")
        code, _, err = _system_install(config, user, tmp_path / "units2", monkeypatch, capsys)
        assert f"{user}, who cannot read {config}: the file is mode 0600" in err
        assert f"chown {user} {config}" in err

        os.chown(config, pwd_uid(user), -1)
        code, _, err = _system_install(config, user, tmp_path / "units3", monkeypatch, capsys)
        assert code == 0 and "cannot read" not in err
    finally:
        shutil.rmtree(trial)


def pwd_uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def test_a_unit_for_a_config_file_that_is_not_there_says_to_create_it(tmp_path: Path, home: Path,
                                                                       capsys) -> None:
    from openclaw.cli import main

    assert main(["service", "install"]) == 0  # no file at the default path: the defaults load
    err = capsys.readouterr().err
    assert f"there is no config file at {home / '.config/openclaw/openclaw.toml'}" in err
