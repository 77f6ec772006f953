"""Production configuration: check --deploy passes, docker-compose names real entry points and
only variables that settings reads, and docs/configuration.md documents every variable."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
import yaml
from django.conf import settings

from nomadgpu.settings import ENV_VARS
from tests.support.processes import ROOT

APP_SERVICES = ("migrate", "web", "worker", "beat")
PRODUCTION_ENV = {
    "DEBUG": "0",
    "SECRET_KEY": "k3p9-" + "Zq8xW2vL7nR4tY6uB1mC5oD0eF3gH9jK" * 2,
    "ALLOWED_HOSTS": "nomadgpu.example.com",
    "FIELD_ENCRYPTION_KEY": "dGVzdC1vbmx5LWtleS10ZXN0LW9ubHkta2V5LTMyYnk=",
    "DATABASE_URL": "postgres://nomadgpu:pw@127.0.0.1:1/nomadgpu",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
}


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_check_deploy_passes_with_production_variables(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "NOMADGPU_VAR_DIR": str(tmp_path), **PRODUCTION_ENV}

    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "NOMADGPU_VAR_DIR": str(tmp_path), "DEBUG": "0"}

    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_compose_runs_web_worker_one_beat_postgres_and_redis():
    services = compose()["services"]

    assert {"web", "worker", "beat", "postgres", "redis"} <= set(services)
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1
    for name in ("web", "postgres", "redis"):
        assert "healthcheck" in services[name], name


@pytest.mark.django_db  # importing the WSGI module verifies the sealed secrets
def test_compose_commands_name_real_entry_points():
    services = compose()["services"]

    web = services["web"]["command"].split()
    assert web[0] == "gunicorn"
    module, attr = web[1].split(":")
    assert callable(getattr(importlib.import_module(module), attr))
    for name in ("worker", "beat"):
        argv = services[name]["command"].split()
        assert argv[:3] == ["celery", "-A", "nomadgpu"], name
        assert argv[3] == name
    assert importlib.import_module("nomadgpu").celery_app.main == "nomadgpu"
    assert services["migrate"]["command"].split()[:2] == ["python", "manage.py"]


def test_compose_sets_only_variables_that_settings_reads():
    services = compose()["services"]
    env_example = (ROOT / ".env.example").read_text()
    example_names = set(re.findall(r"^([A-Z_]+)=", env_example, flags=re.M))

    for name in APP_SERVICES:
        for var in services[name].get("environment", {}):
            assert var in ENV_VARS, f"{name} sets {var}, which settings.py does not read"
    assert example_names - {"POSTGRES_PASSWORD"} <= set(ENV_VARS)


def test_readme_documents_every_variable():
    readme = (ROOT / "docs" / "configuration.md").read_text()

    missing = [name for name in ENV_VARS if f"`{name}`" not in readme]

    assert not missing, f"docs/configuration.md's table lacks {missing}"


def test_procfile_starts_web_workers_beat_and_sandbox_and_every_queue_is_consumed():
    procfile = (ROOT / "Procfile").read_text()
    commands = dict(line.split(": ", 1) for line in procfile.splitlines() if line.strip())

    assert set(commands) == {"web", "worker", "watchdog", "beat", "sandbox"}
    consumed = {
        queue
        for command in commands.values()
        if " worker " in command
        for queue in command.split("-Q ")[1].split()[0].split(",")
    }
    assert consumed == {q.name for q in settings.CELERY_TASK_QUEUES}
    assert settings.CELERY_TASK_ROUTES["jobs.tasks.watchdog_tick"] == {"queue": "watchdog"}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "-Q watchdog" in compose["services"]["watchdog"]["command"]
    assert settings.CELERY_BEAT_SCHEDULE
