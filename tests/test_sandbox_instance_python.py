"""A sandbox instance has its own Python (``sandbox/instance_python.py``): what its setup
installs with ``python -m pip`` or ``pip`` lands in the instance's venv, where its command finds
it, and never in the environment the sandbox runs in (under ``make run``, the portal's .venv).

The sandbox runs here in a throwaway environment that stands for the portal's: it sees this
test run's packages through a ``.pth`` file, and an install that escaped the instance would land
in it, not in the shared one. Over real HTTP, like every sandbox test."""

from __future__ import annotations

import site
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import wait_until
from tests.support.sandbox import Sandbox

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
PIP = "--no-index --no-deps --disable-pip-version-check --quiet"


def tiny_wheel(folder: Path, name: str) -> Path:
    """A pure-Python wheel of one module NAME that says where it was imported from."""
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    info = f"{name}-0.1.dist-info/"
    with zipfile.ZipFile(wheel, "w") as out:
        out.writestr(f"{name}/__init__.py", "WHERE = __file__\n")
        out.writestr(f"{info}METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        out.writestr(
            f"{info}WHEEL",
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        out.writestr(f"{info}RECORD", "")
    return wheel


@pytest.fixture
def portal_python(tmp_path: Path) -> Path:
    """A throwaway environment for the sandbox to run in, standing for the portal's .venv."""
    where = tmp_path / "portal-venv"
    venv.EnvBuilder(symlinks=True, with_pip=False).create(where)
    lines = [f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages()]
    (where / SITE / "_this_test_run.pth").write_text("".join(lines))
    return where / "bin" / "python"


def contents(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def cheapest_ask(box: Sandbox) -> int:
    query = {"rentable": {"eq": True}, "order": [["dph_total", "asc"]], "limit": 1}
    return box.search(query)[0]["id"]


def test_what_an_instance_installs_lands_in_its_own_venv_and_never_in_the_sandboxs(
    sandbox_factory, portal_python, tmp_path
):
    box = sandbox_factory(python=str(portal_python))
    first, second = tiny_wheel(tmp_path, "nomad_probe_a"), tiny_wheel(tmp_path, "nomad_probe_b")
    portal_site = portal_python.parents[1] / SITE
    shared_site = Path(site.getsitepackages()[0])
    before = contents(portal_site), contents(shared_site)
    onstart = (
        f"python -m pip install {PIP} {first}\n"  # the setup, as the qlora-tiny template's
        f"pip install {PIP} {second}\n"
        "python -c 'import nomad_probe_a as a, nomad_probe_b as b, sys; "
        "print(a.WHERE, b.WHERE, sys.prefix, sep=chr(10))' > seen.tmp && mv seen.tmp seen\n"
        "exec sleep 120\n"
    )

    iid = box.create(cheapest_ask(box), onstart=onstart)

    scratch = Path(box.debug(iid)["scratch"])
    seen = scratch / "seen"
    log = scratch / "onstart.log"
    wait_until(seen.exists, timeout=60, what=f"the command to import both ({log})")
    own = scratch / "venv"
    a_file, b_file, prefix = seen.read_text().splitlines()
    assert Path(a_file).is_relative_to(own / SITE), log.read_text()
    assert Path(b_file).is_relative_to(own / SITE)
    assert Path(prefix) == own
    assert (contents(portal_site), contents(shared_site)) == before
    # Destroyed, its disk goes, as a Vast container's does.
    assert box.client().delete(f"/api/v0/instances/{iid}/").status_code == 200
    wait_until(lambda: not own.exists(), timeout=30, what="the destroy to remove the venv")


def test_the_instance_sees_the_sandboxs_packages_and_its_own_come_first(sandbox_factory, tmp_path):
    box = sandbox_factory()
    onstart = (
        "python -c 'import httpx, cryptography, sys, os; "
        'print(sys.prefix, os.environ["VIRTUAL_ENV"], sep=chr(10))\' > seen.tmp'
        " && mv seen.tmp seen\nexec sleep 120\n"
    )

    iid = box.create(cheapest_ask(box), onstart=onstart)

    scratch = Path(box.debug(iid)["scratch"])
    log = scratch / "onstart.log"
    wait_until((scratch / "seen").exists, timeout=30, what=f"the import ({log})")
    prefix, virtual_env = (scratch / "seen").read_text().splitlines()
    assert Path(prefix) == Path(virtual_env) == scratch / "venv"
