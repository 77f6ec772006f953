"""Pack the agent into one file, ``agent.pyz``, that containers run as ``python3 agent.pyz``.

The archive is byte-for-byte reproducible (sorted entries, fixed timestamps and permissions,
no compression), so the server can build it once, cache it and publish a stable sha256.
Standard library only.  CLI: ``python -m agent.build OUT.pyz`` prints the sha256.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHEBANG = b"#!/usr/bin/env python3\n"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
ENTRY = "from agent.__main__ import main\nraise SystemExit(main())\n"


def package_files() -> list[Path]:
    """The agent's Python sources (no caches, no tests, no docs)."""
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def build_zipapp(out_path: str | Path) -> Path:
    """Write the zipapp to OUT_PATH atomically.

    Several worker processes may build the same file at once after a deploy: each writes its
    own temporary file in the target folder and renames it into place, so a reader sees either
    no file or a whole one, and the last rename wins with identical bytes."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            raw.write(SHEBANG)
            with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED) as zf:
                _add(zf, "__main__.py", ENTRY.encode())
                for path in package_files():
                    name = "agent/" + path.relative_to(PACKAGE_DIR).as_posix()
                    _add(zf, name, path.read_bytes())
        tmp.chmod(0o755)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
    info.external_attr = 0o644 << 16
    info.create_system = 3  # Unix, whatever machine builds it
    zf.writestr(info, data)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    target = build_zipapp(sys.argv[1] if len(sys.argv) > 1 else "agent.pyz")
    print(f"{sha256_of(target)}  {target}")
