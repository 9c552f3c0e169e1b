"""Crash-test children forked from one process that has already imported them.

A crash test starts a child process per fault point, and a fresh Python that
imports numpy and rollvault's snapshot layers costs far more than the child's
work. :class:`Zygote` starts ``python child_zygote.py <child script>`` once:
it imports the child script as a module (what its ``__main__`` block does is
not run), then, per request, forks a child that sets its environment and
``sys.argv``, re-reads the fault plan from that environment
(``rollvault.durable.faults`` reads it once at import, which happened in the
zygote), and runs the script as ``python <script> <argv>`` would (``runpy``,
as ``__main__``; its imports are already loaded). Each child is a new process
forked from the same pristine state, so a SIGKILL at a fault point kills that
child only, and the next child (the "fresh process" that checks what the kill
left) shares no memory with it.

:meth:`Zygote.run` returns what :func:`subprocess.run` would: the exit status
(negative for a signal), stdout and stderr. :meth:`Zygote.start` returns at
once, with a handle to poll and wait on (the test signals the child by its pid).
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, Any

_PRELOADED = "_zygote_preloaded"


class Zygote:
    """A forking server for one child script (see the module docstring); a context manager."""

    def __init__(self, child: Path, *, timeout_s: float = 60.0) -> None:
        self.child = child
        self.timeout_s = timeout_s
        self._process = subprocess.Popen(
            [sys.executable, __file__, str(child)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._outputs = Path(tempfile.mkdtemp(prefix="zygote-"))
        self._runs = 0

    def run(
        self, argv: list[str], env: Mapping[str, str], *, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Fork a child running the script with ``argv`` and exactly ``env`` (in ``cwd``)."""
        self._runs += 1
        out = self._outputs / f"{self._runs}.out"
        err = self._outputs / f"{self._runs}.err"
        answer = self._ask(_child_request(argv, env, cwd, out, err, self.timeout_s))
        returncode = int(answer["returncode"])
        stdout, stderr = out.read_text(), err.read_text()
        out.unlink()
        err.unlink()
        return subprocess.CompletedProcess(
            [str(self.child), *argv], returncode, stdout=stdout, stderr=stderr
        )

    def start(
        self,
        argv: list[str],
        env: Mapping[str, str],
        *,
        stdout: Path,
        stderr: Path,
        cwd: Path | None = None,
    ) -> ForkedChild:
        """Fork a child as :meth:`run` does and return at once, its output going to
        ``stdout`` and ``stderr``: for a test that signals the child while it runs."""
        answer = self._ask(
            {**_child_request(argv, env, cwd, stdout, stderr, self.timeout_s), "detach": True}
        )
        return ForkedChild(self, int(answer["pid"]))

    def reap(self, pid: int, *, block: bool) -> int | None:
        """The exit status of the started child ``pid`` (as :meth:`run` reports it), waiting
        for it if ``block``, else None while it runs."""
        answer = self._ask({"reap": pid, "block": block})
        return None if answer["returncode"] is None else int(answer["returncode"])

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait(timeout=self.timeout_s)
            raise RuntimeError(f"the zygote of {self.child} exited ({code}) before answering")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """End the zygote (EOF on its stdin) and remove the children's output files."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=self.timeout_s)
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            for leftover in self._outputs.iterdir():
                leftover.unlink()
            self._outputs.rmdir()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


class ForkedChild:
    """A child of :meth:`Zygote.start`: its pid, and ``poll``/``wait`` as on a ``Popen``.

    It is the zygote's child, not this process's: only the zygote can reap it.
    ``wait`` has no timeout of its own; the zygote's ``timeout_s`` alarm ends a hung child.
    """

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.reap(self.pid, block=False)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.reap(self.pid, block=True)
        assert self.returncode is not None
        return self.returncode


def _child_request(
    argv: list[str],
    env: Mapping[str, str],
    cwd: Path | None,
    stdout: Path,
    stderr: Path,
    timeout_s: float,
) -> dict[str, Any]:
    return {
        "argv": argv,
        "env": dict(env),
        "stdout": str(stdout),
        "stderr": str(stderr),
        "timeout_s": timeout_s,
        "cwd": None if cwd is None else str(cwd),
    }


# -- the zygote process -------------------------------------------------------------------


def _load(script: Path) -> ModuleType:
    sys.path[0] = str(script.resolve().parent)  # as `python <script>` would have it
    spec = importlib.util.spec_from_file_location(_PRELOADED, script)
    assert spec is not None and spec.loader is not None, f"cannot import {script}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PRELOADED] = module
    spec.loader.exec_module(module)
    return module


def _child(module: ModuleType, request: dict[str, Any]) -> int:
    """In the forked child: run the script as ``__main__``; return its exit status."""
    from rollvault.durable import faults

    # A hung child is killed like subprocess.run's timeout would (status -SIGALRM).
    signal.alarm(max(1, int(request["timeout_s"])))
    os.environ.clear()
    os.environ.update(request["env"])
    # Read once at import, in the zygote: this child's variables are read again.
    faults._PLAN = faults.plan_from_environment(os.environ)
    if request["cwd"] is not None:
        os.chdir(request["cwd"])
    script = str(module.__file__)
    sys.argv = [script, *request["argv"]]
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            return 1
        return 0 if code is None else int(code)
    except BaseException:  # noqa: BLE001 - reported like an uncaught exception, status 1
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def _status(wait_status: int) -> int:
    """The exit status as subprocess reports it: negative for a signal."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _reap(pid: int, *, block: bool) -> int | None:
    done, wait_status = os.waitpid(pid, 0 if block else os.WNOHANG)
    return None if done == 0 else _status(wait_status)


def _answer(module: ModuleType, request: dict[str, Any]) -> dict[str, Any]:
    """A started child's pid, a reaped child's status, or a run child's status."""
    if "reap" in request:
        return {"returncode": _reap(int(request["reap"]), block=bool(request["block"]))}
    pid = os.fork()
    if pid == 0:
        os._exit(_child(module, request))
    if request.get("detach"):
        return {"pid": pid}
    return {"returncode": _reap(pid, block=True)}


def _serve(module: ModuleType, requests: IO[str], answers: IO[str]) -> None:
    for line in requests:
        answers.write(json.dumps(_answer(module, json.loads(line))) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(_load(Path(sys.argv[1])), sys.stdin, sys.stdout)
