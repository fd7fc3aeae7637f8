"""`openclaw service install`: write a hardened systemd unit for the daemon and say how to enable it.

The hardening is chosen so that the two things the daemon must still do keep working: run shell
commands under bubblewrap (which creates user, mount and pid namespaces) and use the GPU (device
nodes under /dev, JIT caches). Each setting that was left out on purpose says why, next to the list.
"""

from __future__ import annotations

import argparse
import getpass
import os
import pwd
import re
import shlex
import shutil
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from openclaw.config import data_dir_of, default_config_path, load_config

UNIT_NAME = "openclaw.service"
# The unit's hard limit on open files: room for every descriptor the daemon holds, many times over,
# on any distribution's defaults (some give 4096). Where a user manager's own hard limit is lower,
# systemd sets the closest it may.
OPEN_FILES_LIMIT = 65536
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")

# Left out on purpose (each would break the sandbox or the GPU):
#   NoNewPrivileges=yes  A setuid-root bubblewrap cannot gain root under it. We need no setuid bwrap:
#                        bubblewrap runs unprivileged on user namespaces (setuid mode is off by default
#                        since 0.11.2 and gone upstream), and bwrap sets no_new_privs for its children
#                        itself. Note that systemd implies NoNewPrivileges=yes anyway for a user unit or
#                        a unit with User= once a seccomp option below is set (systemd.exec(5)), so a
#                        setuid-only bubblewrap can never work under this unit; the unit does not
#                        claim the setting so that `systemctl show` tells the truth for root units.
#                        For the same reason nvidia-modprobe (setuid) cannot create /dev/nvidia-uvm
#                        from inside the service: load the driver at boot (nvidia-persistenced).
#   RestrictNamespaces=  bubblewrap needs CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, ...
#   SystemCallFilter=    @system-service lacks mount(2), pivot_root(2) and unshare(2), which bwrap uses.
#   ProtectKernelTunables=yes
#                        It bind-mounts over /proc/sys and friends; the kernel then refuses a fresh
#                        procfs inside a new user+pid namespace ("mount too revealing"), so
#                        `bwrap --unshare-user --unshare-pid --proc /proc` fails with EPERM.
#   RestrictSUIDSGID=yes Its seccomp filter makes openat2(2) fail with ENOSYS, and bubblewrap >= 0.12
#                        built without the openat fallback (assume_kernel >= 5.6, as Arch ships it)
#                        then cannot set up any sandbox (containers/bubblewrap#774). bwrap's own
#                        no_new_privs already makes set-id bits inert for sandboxed commands.
#   PrivateDevices=, DevicePolicy=
#                        Would hide /dev/nvidia*, /dev/dri and /dev/kfd from the engine.
#   MemoryDenyWriteExecute=yes
#                        CUDA, Triton and torch JIT-compile kernels into writable, executable memory.
#   ProtectControlGroups=yes
#                        Makes all of /sys/fs/cgroup read-only, the subtree Delegate=memory hands the
#                        daemon included: each sandboxed command's memory cgroup is made there
#                        (sandbox/cgroups.py). A daemon with User= can write only that subtree anyway.
_HARDENING = (
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "PrivateTmp=yes",
    "ProtectKernelModules=yes",
    "LockPersonality=yes",
    "RestrictRealtime=yes",
    "SystemCallArchitectures=native",
)

_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def add_commands(sub, common_sub) -> None:
    service = common_sub(sub.add_parser("service", help="systemd service").add_subparsers(
        dest="svc_cmd", required=True))
    p = service.add_parser("install", help="write a systemd unit and say how to enable it")
    p.add_argument("--system", action="store_true", help="a system unit (default: a user unit)")
    p.add_argument("--user", dest="run_as", default=None, help="system unit: the user to run as")
    p.add_argument("--force", action="store_true", help="replace a unit file already there")
    p.set_defaults(func=cmd_service_install)


def cmd_service_install(args: argparse.Namespace) -> int:
    # No secret: the unit gives the service its own environment, and this opens nothing.
    config = load_config(args.config, tokens=False, store=False)
    exe = _this_openclaw()
    config_path = (args.config or default_config_path()).expanduser().resolve()
    data_dir, run_as = config.data_dir, args.run_as
    if args.system:
        run_as = service_user(args.run_as)
        try:
            home = Path(pwd.getpwnam(run_as).pw_dir)
        except KeyError:
            print(f"service install: there is no user {run_as} on this machine; create it first "
                  f"(e.g. useradd --system --create-home {shlex.quote(run_as)}), then run this "
                  "again", file=sys.stderr)
            return 1
        # systemd gives the service its user's HOME, not this shell's: the default data_dir
        # (and a data_dir written "~/...") is under that home.
        data_dir = data_dir_of(args.config, home=home)
    try:
        path, instructions = install_unit(exe, config_path, run_as, data_dir,
                                          system=args.system, force=args.force,
                                          python_paths=config.skills.python_paths)
    except (FileExistsError, ValueError) as exc:
        print(f"service install: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}\n{instructions}")
    if not config_path.is_file():
        print(f"warning: there is no config file at {config_path}, which the service is told to "
              "read: create it (`openclaw init`) before starting the service", file=sys.stderr)
    elif args.system and (why := unreadable_config(config_path, run_as)):
        print(f"warning: the service runs as {run_as}, who cannot read {config_path}: {why}",
              file=sys.stderr)
    for what, where in (("the config file", config_path), ("data_dir", data_dir),
                        *((f"skills.python_paths[{i}]", Path(os.path.normpath(path)))
                          for i, path in enumerate(config.skills.python_paths))):
        if any(where.absolute().is_relative_to(tmp) for tmp in ("/tmp", "/var/tmp")):
            print(f"warning: {what} {where} is under /tmp, which the service does not see "
                  "(PrivateTmp=yes gives it an empty one): keep it elsewhere before starting it",
                  file=sys.stderr)
    return 0


def _this_openclaw() -> str:
    """The command line that runs this very openclaw, for the unit: the `openclaw` script that
    was started, else this interpreter with `-m openclaw.cli`. Never the `openclaw` PATH finds
    first, which may be another install; quoted, as a venv's path may hold a space."""
    script = Path(sys.argv[0])
    if script.name == "openclaw" and script.is_file():
        return str(script.absolute())
    return shlex.join([sys.executable, "-m", "openclaw.cli"])


def unit_text(exec_path: str, config_path: Path, user: str | None, data_dir: Path, *,
              system: bool | None = None, python_paths: Sequence[Path] = ()) -> str:
    """The unit file for `exec_path run --config config_path`, writable only in `data_dir`.

    `exec_path` is the `openclaw` executable, or a command prefix such as "/usr/bin/python3 -m
    openclaw.cli". `system` defaults to True when a `user` is given (User= only works in system
    units; a user unit always runs as the user who owns it). `python_paths`: the config's
    [skills] python_paths, which the daemon puts on its import path itself (after site-packages,
    and anew at a reload); the unit names them for the admin who reads it, and sets no PYTHONPATH,
    which would go before the standard library and go stale when the config changes.
    """
    system = user is not None if system is None else system
    if user is not None and not system:
        raise ValueError(f"a user unit always runs as its owner, so it cannot run as {user!r}; "
                         "install a system unit (--system) to choose the user")
    data_dir = _absolute(data_dir)
    exec_start = " ".join(_exec_quote(word) for word in
                          [*_exec_words(exec_path), "run", "--config", str(_absolute(config_path))])
    unit = ["[Unit]", "Description=OpenClaw personal agent daemon"]
    if system:
        # The connectors need the network; the user manager has no network-online.target.
        unit += ["Wants=network-online.target", "After=network-online.target"]
    service = [
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={exec_start}",
        "# `systemctl reload openclaw`: the daemon re-reads the config (see `openclaw reload`).",
        "ExecReload=/bin/kill -HUP $MAINPID",
        *([f"User={_check_line(user)}"] if user else []),
        "Restart=on-failure",
        "RestartSec=5",
        "# 2: the config (or a bot token) is wrong; a restart cannot fix it, and every 5 s would",
        "# never reach systemd's start limit. Fix it, then `systemctl restart openclaw`.",
        "RestartPreventExitStatus=2",
        "# READY=1 comes after the model is loaded, which can take minutes for a large one.",
        "TimeoutStartSec=300",
        "WatchdogSec=60",
        "TimeoutStopSec=60",
        "KillSignal=SIGTERM",
        "Environment=PYTHONUNBUFFERED=1",
        *_python_paths_note(python_paths),
        "# The home directory is read-only (ProtectHome=): keep JIT caches with the daemon's state.",
        _environment("XDG_CACHE_HOME", data_dir / "cache"),
        _environment("TRITON_CACHE_DIR", data_dir / "cache" / "triton"),
        _environment("CUDA_CACHE_PATH", data_dir / "cache" / "cuda"),
        "UMask=0077",
        "# Open files: the daemon raises its soft limit to this hard one at start (logged), so that",
        "# a flood of connections to the admin port or many commands' pipes cannot use up the",
        "# usual 1024, after which every shell and files call, the database and the connectors",
        "# fail with \"Too many open files\". The soft limit stays 1024 for anything started before",
        "# that; sandboxed commands get limits of their own.",
        f"LimitNOFILE=1024:{OPEN_FILES_LIMIT}",
        "# The memory cgroup subtree under which each sandboxed command gets a memory limit of its",
        "# own, for all of its processes together (sandbox/cgroups.py).",
        "Delegate=memory",
        "# No MemoryMax=: the right ceiling depends on the model and the roles, and one too low kills",
        "# the daemon while it loads its model, every 5 s. Add one: docs/operating.md, \"Memory\".",
        "",
        "# Hardening that leaves bubblewrap sandboxes and the GPU working. Deliberately absent:",
        "# NoNewPrivileges= (setuid bwrap), RestrictNamespaces= and SystemCallFilter= (bwrap needs",
        "# namespaces, mount, pivot_root), ProtectKernelTunables= (blocks bwrap's --proc /proc),",
        "# RestrictSUIDSGID= (blocks openat2, which bwrap >= 0.12 may need), PrivateDevices= and",
        "# DevicePolicy= (GPU), MemoryDenyWriteExecute= (CUDA/Triton JIT). Details: openclaw/cli/service.py.",
        *_HARDENING,
    ]
    if not system:
        # systemd < 253 silently skips the file-system sandboxing above in user units unless
        # PrivateUsers= is on (>= 253 implies it); say it, so every version applies it.
        # bubblewrap can still nest its own user namespace inside this one.
        service.append("PrivateUsers=yes")
    service += [
        "# Paths the daemon may write; add any read-write paths your [roles] grant beyond data_dir",
        "# with `systemctl edit openclaw`, or the sandbox will find them read-only.",
        f"ReadWritePaths={_path_quote(data_dir)}",
    ]
    install = ["[Install]", f"WantedBy={'multi-user.target' if system else 'default.target'}"]
    header = ["# Written by `openclaw service install`; rerun it with --force to regenerate, or",
              f"# override single settings with `systemctl{'' if system else ' --user'} edit openclaw`."]
    return "\n".join([*header, *unit, "", *service, "", *install]) + "\n"


def _python_paths_note(python_paths: Sequence[Path]) -> list[str]:
    if not python_paths:
        return []
    folders = ", ".join(_check_line(os.path.normpath(_absolute(path))) for path in python_paths)
    return [f"# [skills] python_paths: {folders}",
            "# (the daemon imports skill modules from there itself, as the config says: no PYTHONPATH)"]


def install_unit(exec_path: str, config_path: Path, user: str | None, data_dir: Path, *,
                 system: bool = False, force: bool = False, unit_dir: Path | None = None,
                 python_paths: Sequence[Path] = ()) -> tuple[Path, str]:
    """Write the unit and return its path and the commands that enable it.

    A user unit (the default) goes to ~/.config/systemd/user/ and runs as you; a system unit goes
    to /etc/systemd/system/ with User= (default: the user who ran sudo, else the current user).
    `unit_dir` replaces either folder (tests, packaging). Refuses to replace an existing unit
    unless `force`.
    """
    if user is not None and not system:
        raise ValueError(f"--user {user} needs --system: a user unit always runs as its owner")
    if system:
        user = service_user(user)
    if unit_dir is None:
        unit_dir = SYSTEM_UNIT_DIR if system else Path.home() / ".config" / "systemd" / "user"
    path = unit_dir / UNIT_NAME
    if path.exists() and not force:
        raise FileExistsError(f"{path} already exists; rerun with --force to replace it")
    text = unit_text(exec_path, config_path, user, data_dir, system=system, python_paths=python_paths)
    data_dir = _absolute(data_dir)
    if not system:
        # ReadWritePaths= must exist when the service starts, or systemd fails it with a
        # 226/NAMESPACE error that does not mention the daemon.
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    unit_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{UNIT_NAME}.partial")
    partial.write_text(text)
    partial.chmod(0o644)  # systemd (and `systemctl cat`) read it; it holds no secrets
    os.replace(partial, path)  # a reader never sees a half-written unit
    return path, _instructions(system, user, data_dir)


def service_user(user: str | None = None) -> str:
    """The user a system unit runs as: `user`, else the user who ran sudo, else this one."""
    return user or os.environ.get("SUDO_USER") or getpass.getuser()


def unreadable_config(config: Path, user: str) -> str | None:
    """Why `user` (a system unit's User=) cannot read the config file, which the service then
    stops at once for; None when they can, or when the file's or a folder's ACL decides (not
    judged here). `openclaw init` makes the file 0600 and a new folder for it 0700, its maker's."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    if entry.pw_uid == 0:
        return None
    groups = set(os.getgrouplist(user, entry.pw_gid))

    def allowed(path: Path, bit: int) -> bool:
        st = path.stat()
        try:
            if "system.posix_acl_access" in os.listxattr(path):
                return True
        except OSError:  # a filesystem without extended attributes has no ACLs either
            pass
        shift = 6 if st.st_uid == entry.pw_uid else 3 if st.st_gid in groups else 0
        return bool(st.st_mode >> shift & bit)

    try:
        for folder in reversed(config.parents):  # "/" first
            if not allowed(folder, 1):
                return (f"{folder} is closed to them: `chown {user} {folder}` if it is the "
                        "config's own folder, else keep the config in one they may enter")
        if not allowed(config, 4):
            return (f"the file is mode {stat.S_IMODE(config.stat().st_mode):04o}, not theirs: "
                    f"chown {user} {config} (keep it 0600: it may hold tokens)")
    except OSError:
        return None  # not there: the caller says so
    return None


def _instructions(system: bool, user: str | None, data_dir: Path) -> str:
    if system:
        return "\n".join([
            "As root, create the data folder if it is missing, then enable and start the service:",
            f"  install -d -m 0700 -o {shlex.quote(user or 'root')} {shlex.quote(str(data_dir))}",
            "  systemctl daemon-reload && systemctl enable --now openclaw",
            "Follow its log with: journalctl -u openclaw -f",
        ])
    return "\n".join([
        "Enable and start the service:",
        "  systemctl --user daemon-reload && systemctl --user enable --now openclaw",
        "A user service stops when you log out; to keep it running and start it at boot, run once:",
        "  loginctl enable-linger $USER",
        "Follow its log with: journalctl --user -u openclaw -f",
    ])


def _exec_words(exec_path: str) -> list[str]:
    """The executable and its leading arguments, with an absolute executable path."""
    words = [exec_path] if Path(exec_path).is_file() or not exec_path.split() else shlex.split(exec_path)
    if not words or not words[0]:
        raise ValueError("the executable to run is empty")
    if not os.path.isabs(words[0]):
        found = shutil.which(words[0])
        if found is None:
            raise ValueError(f"cannot find {words[0]!r} on PATH; pass the absolute path of openclaw")
        words[0] = found
    return words


def _exec_quote(word: str) -> str:
    # ExecStart= expands %-specifiers and $VARIABLES; both are doubled to stay literal.
    return _path_quote(word).replace("$", "$$")


def _path_quote(value: str | Path) -> str:
    """`value` as one word of a unit-file setting: quoted when needed, %-specifiers escaped."""
    word = _check_line(str(value))
    if not _PLAIN_WORD.match(word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word.replace("%", "%%")


def _environment(name: str, value: Path) -> str:
    return f"Environment={_path_quote(f'{name}={value}')}"


def _check_line(value: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{value!r} contains a control character, which a unit file cannot hold")
    return value


def _absolute(path: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else path.resolve()
