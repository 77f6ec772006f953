"""Which folders under the checkpoint directory are checkpoints, as their markers say.

The training script's half of the protocol is ``agent.mark_ready`` in ``agent/__init__.py``
(standard library only, so that a script imports it without this package's httpx); this is the
agent's half: the ready folders to upload (``find_ready``), the NOMAD_UPLOADED marker that
tells the script a folder may go (``mark_uploaded``), and a copy of the checkpoint to resume
from that this disk already holds (``local_copy``, ``mark_restored``). PROTOCOL.md §5, item 2.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import READY_MARKER, UPLOADED_MARKER
from agent.checkpoints.errors import CheckpointChanged
from agent.checkpoints.pack import object_pieces, plan_tar


@dataclass(frozen=True)
class ReadyCheckpoint:
    path: Path
    step: int


def find_ready(
    checkpoint_dir: Path, *, on_bad_marker: Callable[[Path, str], None]
) -> list[ReadyCheckpoint]:
    """Sub-directories holding NOMAD_READY and not yet NOMAD_UPLOADED, oldest step first."""
    found = []
    try:
        children = list(os.scandir(checkpoint_dir))
    except FileNotFoundError:
        return []
    for entry in children:
        if not entry.is_dir(follow_symlinks=False) or entry.name.startswith("."):
            continue
        path = Path(entry.path)
        marker = path / READY_MARKER
        if not marker.is_file() or (path / UPLOADED_MARKER).exists():
            continue
        text = marker.read_text(errors="replace").strip()
        try:
            found.append(ReadyCheckpoint(path, int(text)))
        except ValueError:
            on_bad_marker(marker, text)
    return sorted(found, key=lambda ready: (ready.step, ready.path.name))


def local_copy(
    checkpoint_dir: Path, checkpoint_id: Any, step: int, *, sha256: str | None = None
) -> Path | None:
    """A directory on this disk that already holds checkpoint CHECKPOINT_ID (at STEP): the one
    the training script wrote and this agent uploaded (its NOMAD_UPLOADED holds the id), or a
    restore this container finished earlier (``mark_restored``). There is one after the
    host rebooted and the container restarted on the same disk (Vast keeps it); None on a new
    host, or when the script has deleted it since. A ready directory of that step whose
    marker was never written (the reboot came between the supervisor's answer and the marker)
    counts when it packs to SHA256, the object's digest (given for an unencrypted object only:
    packing is deterministic, encrypting is not)."""
    wanted = str(checkpoint_id)
    restored = checkpoint_dir / f"resume-{step}"
    if _marker_text(_restored_marker(restored)) == wanted and restored.is_dir():
        return restored
    try:
        children = list(os.scandir(checkpoint_dir))
    except FileNotFoundError:
        return None
    for entry in children:
        path = Path(entry.path)
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        if _marker_text(path / READY_MARKER) != str(step):
            continue
        uploaded = _marker_text(path / UPLOADED_MARKER)
        if uploaded == wanted or (uploaded is None and sha256 and _packs_to(path, sha256)):
            return path
    return None


def _packs_to(directory: Path, sha256: str) -> bool:
    """Whether DIRECTORY packs to the object whose digest is SHA256 (read from disk only)."""
    digest = hashlib.sha256()
    try:
        for piece in object_pieces(plan_tar(directory), None):
            digest.update(piece)
    except (CheckpointChanged, OSError):
        return False
    return digest.hexdigest() == sha256


def mark_restored(target: Path, checkpoint_id: Any) -> None:
    """Note beside TARGET that it holds checkpoint CHECKPOINT_ID, complete (written after the
    unpack, so a restore cut short by a reboot is never taken for a copy)."""
    _restored_marker(target).write_text(f"{checkpoint_id}\n")


def _restored_marker(target: Path) -> Path:
    # Beside the directory, not in it: the training script reads the directory as its own.
    return target.parent / f".{target.name}.restored"


def _marker_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def mark_uploaded(ready: ReadyCheckpoint, checkpoint_id: str) -> None:
    # Tells the training script the directory may go, and a restarted agent to skip it.
    (ready.path / UPLOADED_MARKER).write_text(f"{checkpoint_id}\n")
