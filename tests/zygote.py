"""``python -m disttrain ...`` for tests, forked from a process that imported torch once.

A fresh interpreter spends about 1.1 s of CPU importing torch and the command's modules
before the command does anything, and the suite runs hundreds of commands on 2 cores
(``perf record -a`` over ``make test``: processes named python3 took 62 % of its CPU, most
of it imports). Each test process starts one zygote: ``python -m tests.zygote`` imports
torch and the command once, then forks a child per command. The child is the command as
``python -m disttrain ARGS`` runs it: its own pid, environment, working folder, stdin,
stdout and stderr, exit code and signals; only the import is shared. :func:`popen` and
:func:`run` take :class:`subprocess.Popen`'s and :func:`subprocess.run`'s arguments and
fall back to them for anything else (another program, ``start_new_session``, a
``preexec_fn``): a test that kills the launcher's process group still execs the command.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
_lock = threading.Lock()
_zygote: tuple[subprocess.Popen[bytes], str] | None = None
_OFF = "DISTTRAIN_NO_ZYGOTE"  # =1: every command exec'd, as before (to compare, or to rule out)
_SUPPORTED = {
    "env",
    "cwd",
    "stdin",
    "stdout",
    "stderr",
    "text",
    "universal_newlines",
    "capture_output",
    "timeout",
    "check",
    "input",
}


def _socket() -> str:
    """This test process's zygote (started on first use): its socket's path."""
    global _zygote
    with _lock:
        if _zygote is None or _zygote[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="dt-zygote-"), "sock")
            # src first; a caller's own path (an out-of-tree plug-in's folder) kept after it
            search = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
            env = {**os.environ, "PYTHONPATH": search}
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.zygote", path],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            while not os.path.exists(path):
                if proc.poll() is not None:
                    raise RuntimeError("the test zygote did not start")
                select.select([], [], [], 0.02)
            _zygote = (proc, path)
        return _zygote[1]


def _fd(spec: Any, default: int) -> tuple[int, int | None]:
    """(the child's end, our end or None) for a Popen stream argument."""
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        return (w, r) if default else (r, w)
    if spec is None:
        return os.dup(default), None
    if spec == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None
    return os.dup(spec if isinstance(spec, int) else spec.fileno()), None


class Command:
    """A Popen-like handle of one forked command."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None,
        cwd: Any,
        stdin: Any,
        stdout: Any,
        stderr: Any,
        text: bool,
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        ends = [_fd(stdin, 0), _fd(stdout, 1)]
        ends.append((os.dup(ends[1][0]), None) if stderr == subprocess.STDOUT else _fd(stderr, 2))
        status_r, status_w = os.pipe()
        request = {
            "argv": args[3:],
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or os.getcwd()),
        }
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(_socket())
            socket.send_fds(conn, [json.dumps(request).encode()], [e[0] for e in ends] + [status_w])
            self.pid = int(conn.recv(64))
        for child_end, _ in ends:
            os.close(child_end)
        os.close(status_w)
        self._status = status_r
        mode = ("w", "r", "r")
        streams: list[IO[Any] | None] = [
            None
            if mine is None
            else open(mine, m if text else m + "b", buffering=1 if text else -1)  # noqa: SIM115
            for (_, mine), m in zip(ends, mode, strict=True)
        ]
        self.stdin, self.stdout, self.stderr = streams

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            # nothing written: the zygote itself is gone (killed with the test process's
            # tree), and with it the exit code; -9 says "killed", as it most likely was
            self.returncode = int(os.read(self._status, 64) or b"-9")
            os.close(self._status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.poll()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        got: list[Any] = [None, None]
        readers = [
            threading.Thread(target=lambda i=i, s=s: got.__setitem__(i, s.read()))
            for i, s in enumerate((self.stdout, self.stderr))
            if s is not None
        ]
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout)
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(timeout)
        return got[0], got[1]

    def __enter__(self) -> Command:
        return self

    def __exit__(self, *exc: object) -> None:
        for s in (self.stdin, self.stdout, self.stderr):
            if s is not None:
                s.close()
        self.wait()


def _ours(args: Any, kwargs: dict[str, Any]) -> bool:
    command = isinstance(args, list) and args[:3] == [sys.executable, "-m", "disttrain"]
    return command and set(kwargs) <= _SUPPORTED and os.environ.get(_OFF) != "1"


def popen(args: Any, **kwargs: Any) -> Any:
    """:class:`subprocess.Popen`, forked from the zygote where it can be."""
    if not _ours(args, kwargs) or {"capture_output", "timeout", "check", "input"} & set(kwargs):
        return subprocess.Popen(args, **kwargs)
    text = bool(kwargs.get("text") or kwargs.get("universal_newlines"))
    return Command(
        args,
        kwargs.get("env"),
        kwargs.get("cwd"),
        kwargs.get("stdin"),
        kwargs.get("stdout"),
        kwargs.get("stderr"),
        text,
    )


def run(args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """:func:`subprocess.run`, forked from the zygote where it can be."""
    if not _ours(args, kwargs):
        return subprocess.run(args, **kwargs)
    capture = kwargs.pop("capture_output", False)
    timeout, check, data = (
        kwargs.pop("timeout", None),
        kwargs.pop("check", False),
        kwargs.pop("input", None),
    )
    if capture:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if data is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = popen(args, **kwargs)
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# --- the zygote ---------------------------------------------------------------------------


def _child(request: dict[str, Any], fds: list[int], keep_closed: list[int]) -> None:
    """In the forked child: become ``python -m disttrain ARGV``; never returns."""
    code = 1
    try:
        for fd in keep_closed:
            os.close(fd)
        for i in range(3):
            os.dup2(fds[i], i)
        for fd in fds:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _python_path(os.environ.get("PYTHONPATH", ""))
        sys.argv = [str(REPO / "src" / "disttrain" / "__main__.py"), *request["argv"]]
        from disttrain.cli import console

        console()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # as the interpreter would: a traceback, exit 1
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _python_path(given: str) -> None:
    """sys.path as ``python -m`` builds it in this folder: the folder first (a model
    module beside the user's command), then the command's PYTHONPATH, then the rest."""
    import importlib

    ours = [p for p in _ZYGOTE_PATH if p]
    rest = [p for p in sys.path[1:] if p not in ours]
    sys.path[:] = [os.getcwd(), *(p for p in given.split(os.pathsep) if p), *rest]
    importlib.invalidate_caches()  # files written since the zygote started


_ZYGOTE_PATH = os.environ.get("PYTHONPATH", "").split(os.pathsep)


def _serve(path: str) -> None:
    import gc

    import torch  # noqa: F401

    from disttrain import cli
    from disttrain.launch import job, local, preflight  # noqa: F401
    from disttrain.registry import load_plugins

    load_plugins()
    # what every command imports before it does anything, so that no command imports it
    # again: the parser's flags (each config section's and strategy's module), the summary's
    # rich console, the worker's trainer (about 0.6 s of CPU in all), and the checkpoint
    # writer a launcher imports for its workers when they save or resume (0.85 s)
    cli.build_parser()
    from disttrain.checkpoint import dcp  # noqa: F401
    from disttrain.launch import worker  # noqa: F401
    from disttrain.train import progress, trainer  # noqa: F401

    gc.freeze()
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path + ".tmp")
    srv.listen(16)
    os.rename(path + ".tmp", path)  # the client waits for the name: listening by now
    try:
        _loop(srv, parent)
    finally:  # the socket and its folder (tempfile.mkdtemp in _socket) go with the zygote
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _loop(srv: socket.socket, parent: int) -> None:
    status: dict[int, int] = {}  # child pid -> the write end its exit code goes to
    while os.getppid() == parent:  # ends with the test process
        if select.select([srv], [], [], 0.05)[0]:
            conn, _ = srv.accept()
            with conn:
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(msg), fds, [srv.fileno(), conn.fileno(), *status.values()])
                for fd in fds[:3]:
                    os.close(fd)
                status[pid] = fds[3]
                conn.sendall(str(pid).encode())
        while status:
            pid, how = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in status:
                fd = status.pop(pid)
                os.write(fd, str(os.waitstatus_to_exitcode(how)).encode())
                os.close(fd)


if __name__ == "__main__":
    _serve(sys.argv[1])
