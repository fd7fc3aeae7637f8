"""`openclaw` processes forked from one that has imported the command already.

Each `python -m openclaw.cli ...` spends ~1.5 s of CPU importing the command (sqlalchemy, alembic,
aiohttp, the command groups) before it does anything; the CLI tests start a few hundred. Here one
process per test session (the "zygote") imports it once and forks a child per command. The child
is still a process of its own, as a user's is: its own stdin, stdout and stderr pipes, its own
environment, working directory and argv, its exit status, exceptions and signals as `python -m
openclaw.cli` would have them. The zygote imports only, never runs anything, so it has one thread
and no open database or event loop to hand down.
"""

from __future__ import annotations

import gc
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MAIN = os.path.join(_REPO, "openclaw", "cli", "__main__.py")  # argv[0] under `python -m`

# ---- the zygote (its own process) ------------------------------------------------------------


def serve(path: str) -> None:
    """Fork a child per request on the socket at `path`; end at EOF on stdin (the tests ended)."""
    from openclaw.cli.main import main  # noqa: F401 - the import every command pays, paid once

    if threading.active_count() != 1:
        raise RuntimeError("importing the command started a thread: forking it would be unsafe")
    # The imported modules live as long as each child: frozen, a child's collections skip them
    # and its exit does not write to (so copy) every page they are on: 0.7 -> 0.15 s an exit.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    os.write(1, b"ready\n")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(0, selectors.EVENT_READ, "parent")
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(0, 4096):  # only the zygote gets here, never a child: no finally
                    os.unlink(path)
                    os.rmdir(os.path.dirname(path))
                    return
            elif key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    conn.close()
                    _become(json.loads(message), fds)  # does not return
                for fd in fds:
                    os.close(fd)
                conn.send(b"%d" % pid)
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:  # a child ended: its status to whoever asked for it
                pid, conn = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.send(b"%d" % os.waitstatus_to_exitcode(status))
                except OSError:
                    pass  # the asker gave up (a timeout): nobody to tell
                conn.close()


def _become(request: dict, fds: list[int]) -> None:
    """This forked child becomes `python -m openclaw.cli ARGS` with the request's stdio and env."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [_MAIN, *request["args"]]
    from openclaw.cli.main import main

    sys.exit(main())  # up through serve(): the interpreter exits as a command's would


# ---- the test side ---------------------------------------------------------------------------

_lock = threading.Lock()
_zygote: tuple[subprocess.Popen, str] | None = None


def _socket_path() -> str:
    global _zygote
    with _lock:
        if _zygote is None or _zygote[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="openclaw-cli-"), "zygote")
            # sys.path as `python -m` starts it (the working directory first); the repository
            # last, only to find this module.
            code = (f"import sys; sys.path[0] = {os.getcwd()!r}; sys.path.append({_REPO!r})\n"
                    f"from tests.helpers.cli_forks import serve; serve({path!r})")
            proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
            if proc.stdout.readline() != b"ready\n":
                raise RuntimeError("the CLI zygote did not start (see its stderr above)")
            proc.stdout.close()
            _zygote = (proc, path)
        return _zygote[1]


def forked_run(args: list[str], env: dict[str, str], stdin: str,
               timeout: float) -> subprocess.CompletedProcess:
    """`python -m openclaw.cli ARGS`, forked, run to its end; as subprocess.run(..., input=stdin,
    capture_output=True, text=True, timeout=timeout, env=env) would give it."""
    command = [sys.executable, "-m", "openclaw.cli", *args]
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(_socket_path())
        request = {"args": args, "env": env, "cwd": os.getcwd()}
        socket.send_fds(conn, [json.dumps(request).encode()], [in_r, out_w, err_w])
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    pid = int(conn.recv(64))
    encoding = locale.getpreferredencoding(False)
    try:
        returncode, out, err = _communicate(pid, conn, in_w, out_r, err_r,
                                            stdin.encode(encoding), timeout, command)
    finally:
        conn.close()
    return subprocess.CompletedProcess(command, returncode, _text(out, encoding), _text(err, encoding))


def _communicate(pid, conn, in_w, out_r, err_r, data: bytes, timeout: float, command):
    deadline = time.monotonic() + timeout
    outputs = {out_r: bytearray(), err_r: bytearray()}
    returncode = None
    sel = selectors.DefaultSelector()
    try:
        sel.register(conn, selectors.EVENT_READ)
        for fd in outputs:
            sel.register(fd, selectors.EVENT_READ)
        if data:
            os.set_blocking(in_w, False)
            sel.register(in_w, selectors.EVENT_WRITE)
        else:
            os.close(in_w)
            in_w = None
        while sel.get_map():
            left = deadline - time.monotonic()
            ready = sel.select(max(left, 0))
            if not ready and left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(command, timeout, bytes(outputs[out_r]),
                                                bytes(outputs[err_r]))
            for key, _ in ready:
                if key.fd == in_w:
                    try:
                        data = data[os.write(in_w, data[:65536]):]
                    except BrokenPipeError:
                        data = b""  # the command stopped reading, as subprocess.run allows
                    if not data:
                        sel.unregister(in_w)
                        os.close(in_w)
                        in_w = None
                elif key.fileobj is conn:
                    returncode = int(conn.recv(64))
                    sel.unregister(conn)
                else:
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        outputs[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
    finally:
        sel.close()
        for fd in (in_w, out_r, err_r):
            if fd is not None:
                os.close(fd)
    return returncode, bytes(outputs[out_r]), bytes(outputs[err_r])


def _text(data: bytes, encoding: str) -> str:
    # subprocess's text mode: the locale's encoding, universal newlines.
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
