"""Instance processes: the onstart script as a local process group.

Each run of an instance's onstart is ``bash onstart.sh`` in its scratch folder, in a new
session (``start_new_session=True``), so the whole "container" can be frozen, thawed or
killed with one signal to the group. The container counts as ended when no live process
of the group remains: the script may background its real work (``nohup agent &``) and
exit, as Vast onstart scripts often do, without the instance being marked ``exited``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sandbox import instance_python

# How often a watcher looks for the group's last process.
POLL_S = 0.05
# Variables of the sandbox's own environment an instance inherits (a container has few).
PASSTHROUGH = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
)

ExitCallback = Callable[[int, int, "int | None"], None]
# The instance's own interface counters in /proc/net/dev's format, written by the metering
# (``traffic.count_in_container``): its processes share the host's interfaces, so its agent
# reads these instead (NOMAD_NET_DEV).
NET_DEV_FILE = "net_dev"


def instance_env(
    *,
    instance_id: int,
    api_key: str,
    user_env: dict[str, str],
    scratch: Path,
    sandbox_url: str,
    proxy_url: str,
) -> dict[str, str]:
    """The environment of an instance's onstart: the user's variables plus what Vast injects."""
    env = {k: os.environ[k] for k in PASSTHROUGH if k in os.environ}
    # Port maps and other docker flags travel in the env dict as "-p 8000:8000": not variables.
    env.update({k: str(v) for k, v in user_env.items() if k and not k.startswith("-")})
    # The "image" here is this machine: the instance's own venv (instance_python) comes first,
    # so `python` and `pip` install into it, then the sandbox's interpreter and the system's.
    base_path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    own = instance_python.bin_dir(scratch)
    env["PATH"] = f"{scratch / 'bin'}:{own}:{Path(sys.executable).parent}:{base_path}"
    env["VIRTUAL_ENV"] = str(own.parent)
    env.setdefault("HOME", str(scratch))
    env.update(
        CONTAINER_ID=str(instance_id),
        CONTAINER_API_KEY=api_key,
        VAST_CONTAINERLABEL=f"C.{instance_id}",
        PUBLIC_IPADDR="127.0.0.1",
        SANDBOX_URL=sandbox_url,
        SANDBOX_INSTANCE_ID=str(instance_id),
        SANDBOX_DIR=str(scratch),
        PYTHONUNBUFFERED="1",
        NOMAD_NET_DEV=str(scratch / NET_DEV_FILE),
    )
    # Every HTTP(S) request goes through the sandbox's metering proxy, like a NIC counter.
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        env[name] = proxy_url
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


# A container is more than its process group: the agent starts the training command in a new
# session, as any program may. Every process of an instance inherits SANDBOX_CONTAINER=<token>,
# so destroy, freeze and the exit watch reach all of them, like a cgroup would.
_CONTAINERS: dict[int, bytes] = {}  # pgid of the onstart leader -> environ marker


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def member_states(pgid: int) -> dict[int, str]:
    """Live (non-zombie) processes of an instance, its process group and its marked processes,
    with their scheduler state (``R``, ``S``, ``T`` for stopped ...)."""
    marker = _CONTAINERS.get(pgid)
    members = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 3 or fields[0] == "Z":
            continue
        if int(fields[2]) == pgid or (marker is not None and marker in _environ(name)):
            members[int(name)] = fields[0]
    return members


def group_members(pgid: int) -> list[int]:
    return list(member_states(pgid))


def remember_container(pgid: int) -> None:
    """Find the marker of a group that outlived a previous sandbox process."""
    for pid in group_members(pgid):
        for item in _environ(str(pid)).split(b"\0"):
            if item.startswith(b"SANDBOX_CONTAINER="):
                _CONTAINERS[pgid] = item + b"\0"
                return


def group_alive(pgid: int) -> bool:
    if os.path.isdir("/proc"):
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_belongs(pgid: int, instance_id: int) -> bool:
    """Whether a surviving group (found after a restart) really runs this instance."""
    marker = f"SANDBOX_INSTANCE_ID={instance_id}\0".encode()
    for pid in group_members(pgid):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes():
                return True
        except OSError:
            continue
    return False


def signal_group(pgid: int | None, sig: int) -> None:
    """Signal every process of the instance whose onstart leader was PGID."""
    if not pgid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    if pgid in _CONTAINERS:
        for pid in group_members(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


class Processes:
    """Starts, watches and stops the onstart process groups of all instances."""

    def __init__(self, on_exit: ExitCallback) -> None:
        self.on_exit = on_exit
        self.groups: dict[int, int] = {}  # pgid -> instance id
        self.lock = threading.Lock()

    def start(self, instance_id: int, scratch: Path, env: dict[str, str]) -> int:
        """Run ``bash onstart.sh`` in the scratch folder (its Python made on the first start,
        ``instance_python``); returns the process group id."""
        instance_python.ensure(scratch)
        token = uuid.uuid4().hex
        with (scratch / "onstart.log").open("ab") as log:
            proc = subprocess.Popen(
                ["bash", str(scratch / "onstart.sh")],
                cwd=scratch,
                env={**env, "SANDBOX_CONTAINER": token},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _CONTAINERS[proc.pid] = f"SANDBOX_CONTAINER={token}\0".encode()
        self._track(instance_id, proc.pid, proc)
        return proc.pid

    def adopt(self, instance_id: int, pgid: int) -> None:
        """Watch a group that outlived a previous sandbox process."""
        remember_container(pgid)
        self._track(instance_id, pgid, None)

    def _track(self, instance_id: int, pgid: int, proc: subprocess.Popen | None) -> None:
        with self.lock:
            self.groups[pgid] = instance_id
        threading.Thread(target=self._watch, args=(instance_id, pgid, proc), daemon=True).start()

    def _watch(self, instance_id: int, pgid: int, proc: subprocess.Popen | None) -> None:
        code = proc.wait() if proc else None  # reap the leader, or it lingers as a zombie
        while group_alive(pgid):
            time.sleep(POLL_S)
        with self.lock:
            self.groups.pop(pgid, None)
        _CONTAINERS.pop(pgid, None)
        self.on_exit(instance_id, pgid, code)

    def kill(self, pgid: int | None, grace_s: float = 0.0) -> None:
        """Stop a group: SIGTERM, SIGKILL after ``grace_s`` (``docker stop``), or SIGKILL now."""
        if not pgid:
            return
        if grace_s <= 0:
            signal_group(pgid, signal.SIGKILL)
            signal_group(pgid, signal.SIGCONT)  # a frozen group must run to die
            return
        signal_group(pgid, signal.SIGTERM)
        signal_group(pgid, signal.SIGCONT)
        timer = threading.Timer(grace_s, signal_group, args=(pgid, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def kill_all(self) -> None:
        with self.lock:
            pgids = list(self.groups)
        for pgid in pgids:
            self.kill(pgid)
