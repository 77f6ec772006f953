"""A job's code folder as the deterministic .tar.gz the CLI uploads (docs/own-code-and-secrets.md,
"From the CLI").

The pack is content-addressed by its sha256, so the same code must give the same bytes: entries
sorted, mtime 0, owner 0 without names, only the mode bits kept from the files' metadata, a gzip
header without a name or time. What git would leave out stays out: every ``.gitignore`` in the
tree, a ``.nomadignore`` at the root (read last, so it can also take back what a ``.gitignore``
leaves out), and ``.git`` always.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pathspec

NOMADIGNORE = ".nomadignore"
ALWAYS_LEFT_OUT = ".git"  # the folder, or the file a worktree or submodule has instead
MB = 1024 * 1024
BIGGEST_SHOWN = 5


class PackError(Exception):
    """The folder cannot be packed; the message says why, in a sentence."""


class PackTooBig(PackError):
    """The pack passed the cap: ``entries`` says what the folder holds, to name its biggest."""

    def __init__(self, max_bytes: int, entries: list[Entry]) -> None:
        super().__init__(f"the code pack is over {max_bytes / MB:g} MB")
        self.max_bytes, self.entries = max_bytes, entries


@dataclass(frozen=True)
class Entry:
    """One member of the pack: ``rel`` is its path inside it, with ``/`` separators."""

    rel: str
    path: Path
    kind: str  # "dir", "file" or "link"
    mode: int
    size: int = 0
    link: str = ""


@dataclass
class Pack:
    """A packed folder: the .tar.gz in ``file`` (a temporary file, read from the start)."""

    file: BinaryIO
    sha256: str
    size: int
    files: int
    entries: list[Entry] = field(repr=False)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Pack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pack_folder(folder: Path, *, max_bytes: int) -> Pack:
    """Pack FOLDER; PackError when it cannot be read, a link leaves it, or the pack would be
    bigger than MAX_BYTES (the message then names the biggest files)."""
    if not folder.is_dir():
        raise PackError(f"the workdir {folder} is not a folder")
    entries = collect(folder)
    out = tempfile.TemporaryFile()  # noqa: SIM115 (the Pack owns it; closed with the Pack)
    sink = _Sink(out, max_bytes)
    try:
        write_tar(entries, sink)
    except _TooBig:
        out.close()
        raise PackTooBig(max_bytes, entries) from None
    except BaseException:
        out.close()
        raise
    out.seek(0)
    files = sum(1 for e in entries if e.kind != "dir")
    return Pack(out, sink.digest.hexdigest(), sink.size, files, entries)


# ---- what goes in -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    """The ignore files that apply to one folder: its own and its parents' ``.gitignore``
    (shallow to deep: a deeper one wins, as in git), then the root's ``.nomadignore``."""

    layers: tuple[tuple[str, pathspec.GitIgnoreSpec], ...] = ()
    last: pathspec.GitIgnoreSpec | None = None

    def ignores(self, rel: str, *, is_dir: bool) -> bool:
        """Whether REL (relative to the root) is left out: the last pattern that matches it
        decides, across the files as within one (``!`` takes a path back)."""
        verdict = False
        layers = (*self.layers, ("", self.last)) if self.last else self.layers
        for base, spec in layers:
            inside = rel[len(base) + 1 :] if base else rel
            decided = spec.check_file(inside + "/" if is_dir else inside).include
            if decided is not None:
                verdict = decided
        return verdict

    def below(self, base: str, spec: pathspec.GitIgnoreSpec | None) -> Rules:
        """These rules plus the ``.gitignore`` of the folder BASE (if it has one)."""
        if spec is None:
            return self
        return Rules((*self.layers, (base, spec)), self.last)


def collect(root: Path) -> list[Entry]:
    """Every entry of ROOT that is not ignored, sorted by path; PackError for an unreadable
    folder or ignore file, or a symbolic link that points outside ROOT."""
    entries: list[Entry] = []
    _walk(root, "", Rules(), root.resolve(), entries)
    return sorted(entries, key=lambda e: e.rel)


def _walk(folder: Path, rel: str, rules: Rules, real_root: Path, out: list[Entry]) -> None:
    try:
        with os.scandir(folder) as listing:
            children = sorted(listing, key=lambda d: d.name)
    except OSError as exc:
        raise PackError(f"cannot read the folder {folder}: {exc.strerror}") from exc
    if not rel:  # the root: its .nomadignore is read after every .gitignore
        rules = Rules(last=read_ignore_file(folder / NOMADIGNORE))
    rules = rules.below(rel, read_ignore_file(folder / ".gitignore"))
    for child in children:
        if child.name == ALWAYS_LEFT_OUT:
            continue
        child_rel = f"{rel}/{child.name}" if rel else child.name
        # Ignored first: what is left out (a .venv linked from elsewhere) is never judged.
        if rules.ignores(child_rel, is_dir=_is_folder(child)):
            continue
        entry = _entry(Path(child.path), child_rel, real_root)
        if entry is None:
            continue
        out.append(entry)
        if entry.kind == "dir":
            _walk(entry.path, child_rel, rules, real_root, out)


def _is_folder(child: os.DirEntry) -> bool:
    try:
        return child.is_dir(follow_symlinks=False)
    except OSError as exc:
        raise PackError(f"cannot read {child.path}: {exc.strerror}") from exc


def _entry(path: Path, rel: str, real_root: Path) -> Entry | None:
    """REL as a pack entry; None for what git would not hold either (sockets, pipes, devices)."""
    try:
        info = path.lstat()
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror}") from exc
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISDIR(info.st_mode):
        return Entry(rel, path, "dir", mode)
    if stat.S_ISREG(info.st_mode):
        return Entry(rel, path, "file", mode, size=info.st_size)
    if stat.S_ISLNK(info.st_mode):
        return Entry(rel, path, "link", mode, link=link_inside(path, rel, real_root))
    return None


def link_inside(path: Path, rel: str, real_root: Path) -> str:
    """The link's target as the pack stores it, relative (an absolute one would name a path of
    this machine, and the host's safe extraction refuses it); PackError when it leaves the folder,
    since the host would not have what it points at."""
    target = os.readlink(path)
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(real_root):
        raise PackError(outside(rel, target))
    if os.path.isabs(target):
        return os.path.relpath(real, os.path.realpath(path.parent))
    # Judged by its text too: "../proj/x" may come back in here but not where the pack lands.
    lexical = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    if lexical == ".." or lexical.startswith("../"):
        raise PackError(outside(rel, target))
    return target


def outside(rel: str, target: str) -> str:
    """The refusal of a link that leaves the folder, in a sentence."""
    return (
        f"{rel} is a symbolic link to {target}, outside the workdir: the host would not have "
        f"it. Copy what it points at into the folder, or leave the link out in {NOMADIGNORE}"
    )


def read_ignore_file(path: Path) -> pathspec.GitIgnoreSpec | None:
    """The patterns of a ``.gitignore``-style file; None when there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror}") from exc
    return pathspec.GitIgnoreSpec.from_lines(text.splitlines())


# ---- the bytes --------------------------------------------------------------------------------


class _TooBig(Exception):
    pass


class _Sink:
    """Where gzip writes: the temporary file, with a running sha256, size and the cap."""

    def __init__(self, out: BinaryIO, max_bytes: int) -> None:
        self.out, self.max_bytes = out, max_bytes
        self.digest = hashlib.sha256()
        self.size = 0
        self.full = False

    def write(self, data: bytes) -> int:
        # Once over, later writes (gzip's trailer when the abandoned writer is collected) are
        # swallowed: the pack is thrown away, and a second raise would only print noise.
        if self.full:
            return len(data)
        self.size += len(data)
        if self.size > self.max_bytes:
            self.full = True
            raise _TooBig
        self.digest.update(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def write_tar(entries: list[Entry], sink: _Sink) -> None:
    """ENTRIES as a .tar.gz into SINK, the same bytes for the same names, modes and contents."""
    gz = gzip.GzipFile(filename="", mode="wb", fileobj=sink, compresslevel=6, mtime=0)
    tar = tarfile.TarFile(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT)
    for entry in entries:
        add(tar, entry)
    tar.close()
    gz.close()


def add(tar: tarfile.TarFile, entry: Entry) -> None:
    """ENTRY into TAR with nothing of this machine but its name, mode and content."""
    info = tarfile.TarInfo(entry.rel)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = entry.mode, 0, 0, 0, "", ""
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif entry.kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, entry.link
        tar.addfile(info)
    else:
        info.size = entry.size
        try:
            with entry.path.open("rb") as content:
                tar.addfile(info, content)
        except OSError as exc:
            why = exc.strerror or f"it changed while being packed ({exc})"
            raise PackError(f"cannot read {entry.path}: {why}") from exc


# ---- sentences --------------------------------------------------------------------------------


def human_size(n: float) -> str:
    """``512 B``, ``3.4 KB``, ``201.0 MB`` (binary units, as the server's limit is counted)."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def biggest_files(entries: list[Entry], n: int = BIGGEST_SHOWN) -> list[Entry]:
    """The N biggest files of ENTRIES, biggest first (ties by path, so the list is stable)."""
    files = [e for e in entries if e.kind == "file"]
    return sorted(files, key=lambda e: (-e.size, e.rel))[:n]


def biggest_lines(entries: list[Entry]) -> str:
    """The biggest files, one per line, for a message about the cap."""
    shown = [f"  {human_size(e.size):>10}  {e.rel}" for e in biggest_files(entries)]
    return (
        "its biggest files:\n"
        + "\n".join(shown)
        + f"\nleave out what the job does not need in {NOMADIGNORE} (gitignore syntax)"
    )
