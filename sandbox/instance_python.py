"""Each instance's own Python: a venv in its scratch folder, first on its PATH.

A container on Vast has its own filesystem: whatever its setup installs (``pip install -r
requirements.txt``) lands in the image's Python and goes when the instance is destroyed. The
sandbox's "image" is this machine, so without this an instance's ``python -m pip install``
would install into the environment the sandbox itself runs in: under ``make run``, the
portal's ``.venv`` (the field report of issue 38: 5.7 GB of HF packages and CUDA wheels).

So every instance gets ``<scratch>/venv``, made once, on its first start:

- made with ``venv.EnvBuilder(system_site_packages=True, with_pip=False)``: about 10 ms in
  process (``python -m venv --system-site-packages --without-pip`` is 0.2 s as a command,
  with pip 10-17 s on a loaded two-core machine: ensurepip unpacks and installs pip each
  time; measured for issue 38);
- a ``.pth`` file in its site-packages adds the sandbox's own site-packages *after* the
  venv's (``site.addsitedir``, which also reads the ``.pth`` files there): the instance
  sees what the image holds (the agent's httpx and cryptography, and pip itself, so
  ``python -m pip`` works without a pip of its own), and what it installs shadows it. When
  the sandbox runs in a venv, ``--system-site-packages`` alone would show the base
  interpreter's packages, not the venv's: hence the ``.pth``;
- ``pip`` and ``pip3`` in its ``bin`` run ``python -m pip`` with the venv's interpreter, so
  both spellings install into the instance. pip installs into the running interpreter's
  ``sys.prefix`` and never uninstalls a distribution outside it ("Not uninstalling ...
  outside environment", pip's ``req_uninstall``): an upgrade of a package the image holds
  lands in the venv and leaves the image's copy alone.

``instance_env`` (``sandbox/processes.py``) puts ``<scratch>/venv/bin`` first on the PATH, after
the fake ``nvidia-smi``, and sets ``VIRTUAL_ENV``. A command that names the sandbox's own
interpreter by its full path (``/path/to/.venv/bin/python -m pip``) still reaches it: name
``python``, as on a real host. Destroying the instance removes the venv, as Vast discards a
destroyed container's disk.
"""

from __future__ import annotations

import shutil
import site
import sys
import threading
import venv
from pathlib import Path

VENV_DIR = "venv"
PTH_NAME = "_sandbox_image.pth"
PIP_SHIM = '#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n'


def venv_dir(scratch: Path) -> Path:
    return scratch / VENV_DIR


def bin_dir(scratch: Path) -> Path:
    """The instance's ``bin``: first on its PATH after the fake ``nvidia-smi``."""
    return venv_dir(scratch) / "bin"


def ensure(scratch: Path) -> Path:
    """The instance's venv, made on the first call (the ``.pth`` is written last, so a venv
    half made when the sandbox stopped is made again). Returns its folder."""
    where = venv_dir(scratch)
    pth = _site_packages(where) / PTH_NAME
    if pth.exists():
        return where
    venv.EnvBuilder(system_site_packages=True, symlinks=True, with_pip=False).create(where)
    for name in ("pip", "pip3", f"pip{sys.version_info.major}.{sys.version_info.minor}"):
        shim = where / "bin" / name
        shim.write_text(PIP_SHIM)
        shim.chmod(0o755)
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in image_site_dirs()))
    return where


def image_site_dirs() -> list[str]:
    """The site-packages of the environment the sandbox runs in: what the "image" holds."""
    return [d for d in site.getsitepackages() if Path(d).is_dir()]


def discard(scratch: Path) -> None:
    """Remove the instance's venv (its destroy), in the background: a big install takes
    seconds to delete, and the request that destroyed it should not wait."""
    where = venv_dir(scratch)
    if where.exists():
        threading.Thread(target=shutil.rmtree, args=(where, True), daemon=True).start()


def _site_packages(where: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return where / "lib" / version / "site-packages"
