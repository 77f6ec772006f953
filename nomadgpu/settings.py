"""NomadGPU settings: one file, environment variables only.

Every variable has an embedded default that needs no server (SQLite under ``var/``, kombu's
filesystem broker, the sandbox marketplace, local object storage), so ``make run`` works on a
fresh machine. Production switches by variables; ``ENV_VARS`` records every name read here so
the table in docs/configuration.md and the docker-compose test can be checked against it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

BASE_DIR = Path(__file__).resolve().parent.parent
ENV_VARS: dict[str, str] = {}


def env(name: str, default: str = "") -> str:
    """Read NAME, or the file named by NAME_FILE (Docker secrets), else the default."""
    ENV_VARS[name] = default
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        return Path(file_path).read_text().strip()
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    return env(name, "1" if default else "0").strip().lower() in {"1", "true", "yes", "on"}


def envint(name: str, default: int) -> int:
    return int(env(name, str(default)))


def envfloat(name: str, default: float) -> float:
    return float(env(name, str(default)))


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


VAR_DIR = Path(env("NOMADGPU_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = envbool("DEBUG", True)
SECRET_KEY = env("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set SECRET_KEY to a long random string "
            '(python -c "import secrets; print(secrets.token_urlsafe(50))").'
        )
    SECRET_KEY = "dev-only-" + "x" * 50
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")
# The public URL agents call back to; it is templated into each attempt's bootstrap script.
SITE_URL = env("SITE_URL", "http://127.0.0.1:8000").rstrip("/")
NOMADGPU_ENV = env("NOMADGPU_ENV", "dev")  # part of every instance label: ngpu:<env>:<job>:<n>

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "ninja",
    "nomadgpu",
    "hosts",
    "jobs",
    "billing",
    "statuspage",
    "notify",
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "nomadgpu.urls"
WSGI_APPLICATION = "nomadgpu.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "nomadgpu.context_processors.teams",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env("DATABASE_URL", f"sqlite:///{VAR_DIR / 'nomadgpu.sqlite3'}"),
        conn_max_age=envint("DATABASE_CONN_MAX_AGE", 60),
        # A kept connection is checked before a request or task reuses it: after a database
        # restart the first heartbeat each web thread takes would otherwise fail on a dead
        # connection (a 500), and the agent back off once more before its beat lands.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so a worker in another process sees the test database too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA busy_timeout=10000;",
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django turns psycopg's prepared statements off (None); a threshold no statement reaches
    # turns them back on for the statements that ask with prepare=True, the heartbeat's two
    # (jobs.agent_api.heartbeat_store). Django's own cursors bind on the client and never prepare.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("prepare_threshold", 2**31 - 1)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
FORMS_URLFIELD_ASSUME_HTTPS = True
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# Agent JSON is small; checkpoints never pass through Django.
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("DATA_UPLOAD_MAX_MEMORY_SIZE", 256 * 1024)

# --- Security (production: DEBUG=0 turns these on) ---------------------------------------
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Team secrets (Vast key, bot token, storage keys) are sealed with this AES-256-GCM key.
# Comma-separated: the first encrypts, the rest still decrypt (key rotation).
FIELD_ENCRYPTION_KEYS = envlist("FIELD_ENCRYPTION_KEY", "")

# --- Celery ------------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "filesystem://")
BROKER_DIR = VAR_DIR / "broker"
# How often a worker looks for new messages on a polling broker (the embedded filesystem one):
# a tick waits up to this long before a worker sees it. Redis pushes, so it has no such delay.
BROKER_POLLING_INTERVAL_S = envfloat("BROKER_POLLING_INTERVAL_S", 0.1)
BROKER_IS_POLLED = CELERY_BROKER_URL.startswith("filesystem://")
if BROKER_IS_POLLED:
    for sub in ("out", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "out"),
        "data_folder_out": str(BROKER_DIR / "out"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": BROKER_POLLING_INTERVAL_S,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_TIMEZONE = "UTC"
# Watchdog ticks have a queue of their own, so a slow rent never delays loss detection:
# `make run` and docker-compose start a worker for it alone. A worker started without -Q
# consumes both queues (tests, a one-process setup).
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = (Queue("celery"), Queue("watchdog"))
CELERY_TASK_ROUTES = {"jobs.tasks.watchdog_tick": {"queue": "watchdog"}}
# A task that calls Vast is stopped after this long (the client retries inside it), and is
# requeued if its worker dies: all of them are safe to run twice.
VAST_TASK_SOFT_LIMIT_S = envint("VAST_TASK_SOFT_LIMIT_S", 300)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

WATCHDOG_INTERVAL_S = envfloat("WATCHDOG_INTERVAL_S", 5.0)
# The watchdog's own grace periods (jobs.watchdog) and the re-rent backoff (jobs.renting).
# Drills and tests shorten them; production rarely needs to.
ADOPT_AFTER_S = envfloat("ADOPT_AFTER_S", 30.0)  # a create in flight is left alone this long
REQUESTED_GRACE_S = envfloat("REQUESTED_GRACE_S", 300.0)  # a create never seen: given up
ORPHAN_GRACE_S = envfloat("ORPHAN_GRACE_S", 120.0)  # an unowned labelled instance may live
RENT_NUDGE_AFTER_S = envfloat("RENT_NUDGE_AFTER_S", 30.0)  # a planned attempt's lost message
RENT_BACKOFF_START_S = envint("RENT_BACKOFF_START_S", 15)
RENT_BACKOFF_CAP_S = envint("RENT_BACKOFF_CAP_S", 300)
# A job is moved off a host this long before the host's contract ends (Vast stops an expired
# instance for good): time to checkpoint, rent a replacement and start it.
CONTRACT_MOVE_LEAD_S = envfloat("CONTRACT_MOVE_LEAD_S", 1800.0)
# A job whose host went offline may wait this long in all for it to come back (with its disk)
# before it moves, when waiting is expected to be cheaper (``hosts.wait_or_move``).
HOST_RETURN_CAP_S = envfloat("HOST_RETURN_CAP_S", 600.0)
# A host's start deadline (``jobs.watchdog.start_deadline``): Vast's own start besides the image
# pull (the top of its documented "2-5 minutes"), and the agent's start once the container runs.
# The sandbox compresses Vast's minutes, so its end-to-end tests shorten these alike.
START_PROVISION_S = envfloat("START_PROVISION_S", 300.0)
START_BOOTSTRAP_S = envfloat("START_BOOTSTRAP_S", 60.0)
# One paged instance-list call per provider account at most this often (DESIGN: ~10 s).
PROVIDER_POLL_INTERVAL_S = envfloat("PROVIDER_POLL_INTERVAL_S", 10.0)
# How often each web process writes its beacon (``nomadgpu.ingest``): the agent API is up and
# its database answers. Heartbeat silence while it is not is the supervisor's, never a host's.
# Keep it well under the shortest heartbeat interval; 0 turns the beacon off.
WEB_BEACON_INTERVAL_S = envfloat("WEB_BEACON_INTERVAL_S", 1.0)
# How often the notification outbox is swept for due (retried) deliveries.
NOTIFY_INTERVAL_S = envfloat("NOTIFY_INTERVAL_S", 5.0)
# Spending limits: how long ahead of the money running out a job is asked for its checkpoint
# while none of its uploads was measured yet (then: its measured upload time plus a margin),
# and the $/h per GPU of the pre-flight's reference host.
BUDGET_CHECKPOINT_GRACE_S = envfloat("BUDGET_CHECKPOINT_GRACE_S", 120.0)
BUDGET_ESTIMATE_DPH = envfloat("BUDGET_ESTIMATE_DPH", 0.40)
# Invoices: how often charges and payments are imported from Vast, how far back the first
# import reaches, and when a difference between billed and recorded is flagged.
INVOICE_SYNC_INTERVAL_S = envfloat("INVOICE_SYNC_INTERVAL_S", 3600.0)
INVOICE_LOOKBACK_DAYS = envint("INVOICE_LOOKBACK_DAYS", 30)
INVOICE_TOLERANCE_PCT = envfloat("INVOICE_TOLERANCE_PCT", 2.0)
INVOICE_TOLERANCE_USD = envfloat("INVOICE_TOLERANCE_USD", 0.01)


def tick_expiry_s(interval_s: float) -> float:
    """How long a periodic tick may wait in the broker before it is dropped as stale.

    A tick that waited longer than its interval is superseded by the next one, but it must
    outlive the broker's own delivery delay, or every tick expires on arrival: at a 1 s
    interval on a broker polled once a second, beat and worker lock in phase and each tick
    arrives about 0.95 s late."""
    delivery_s = BROKER_POLLING_INTERVAL_S if BROKER_IS_POLLED else 0.0
    expiry_s = interval_s * 0.9
    if expiry_s < 2 * delivery_s:
        raise ImproperlyConfigured(
            f"A tick every {interval_s:g} s would expire after {expiry_s:g} s, but a worker "
            f"looks at the broker only every {delivery_s:g} s (BROKER_POLLING_INTERVAL_S), so "
            f"ticks could be dropped before any worker sees them. Set BROKER_POLLING_INTERVAL_S "
            f"to at most {expiry_s / 2:g}, or use a longer interval."
        )
    return expiry_s


def every(task: str, interval_s: float) -> dict:
    return {
        "task": task,
        "schedule": timedelta(seconds=interval_s),
        "options": {"expires": tick_expiry_s(interval_s)},
    }


# Not a tunable: how often the beat deletes late S3 writes of ended attempts (jobs.checkpoints).
LATE_UPLOAD_SWEEP_INTERVAL_S = 600.0

CELERY_BEAT_SCHEDULE = {
    "watchdog-tick": every("jobs.tasks.watchdog_tick", WATCHDOG_INTERVAL_S),
    # Spending limits, at the watchdog's cadence (and once when a worker starts).
    "budget-enforce": every("billing.tasks.enforce_budgets", WATCHDOG_INTERVAL_S),
    # Retries and anything a lost nudge left behind; each event also nudges it on commit.
    "notify-deliver-due": every("notify.tasks.deliver_due", NOTIFY_INTERVAL_S),
    "billing-sync-invoices": every("billing.tasks.sync_invoices", INVOICE_SYNC_INTERVAL_S),
    # What a fenced agent's still-valid S3 URLs let land after its attempt ended: deleted.
    "late-uploads-sweep": every("jobs.tasks.sweep_late_uploads", LATE_UPLOAD_SWEEP_INTERVAL_S),
}

# --- Provider: Vast.ai or the sandbox marketplace -----------------------------------------
VAST_URL = env("VAST_URL", "http://127.0.0.1:8700").rstrip("/")
VAST_API_KEY = env("VAST_API_KEY", "sandbox-key")
SANDBOX_DIR = Path(env("SANDBOX_DIR", str(VAR_DIR / "sandbox")))

# --- Object storage: "local" (served by the web process) or "s3" (R2, AWS, MinIO, B2) ------
STORAGE_BACKEND = env("STORAGE_BACKEND", "local")
STORAGE_LOCAL_DIR = Path(env("STORAGE_LOCAL_DIR", str(VAR_DIR / "objects")))
S3_ENDPOINT_URL = env("S3_ENDPOINT_URL", "")
S3_BUCKET = env("S3_BUCKET", "nomadgpu")
S3_ACCESS_KEY_ID = env("S3_ACCESS_KEY_ID", "")
S3_SECRET_ACCESS_KEY = env("S3_SECRET_ACCESS_KEY", "")
S3_REGION = env("S3_REGION", "auto")
# A job's packed code folder (``workdir``), before encryption, in MiB: the member API answers 413
# over it and the portal's form refuses the archive (jobs.code.packs).
WORKDIR_MAX_MB = envint("WORKDIR_MAX_MB", 200)
# Staged model weights (jobs.staging): the Hugging Face Hub the worker mirrors repos from. A
# network fault is tried again on a fixed schedule (jobs.staging.trouble.RETRY_DELAYS_S).
HF_ENDPOINT = env("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
# A staging job none of whose mirrors moved for this long has its task sent again by the
# watchdog (a lost message); tests shorten it.
STAGE_NUDGE_AFTER_S = envint("STAGE_NUDGE_AFTER_S", 60)

# --- Notifications ---------------------------------------------------------------------
# The Bot API base URL; tests point it at a local server speaking the same protocol.
TELEGRAM_API_URL = env("TELEGRAM_API_URL", "https://api.telegram.org").rstrip("/")

# The console shows one line per job event (``nomadgpu.events``: rented, running, host lost,
# running again, finished) and every warning. LOG_LEVEL=DEBUG brings back what repeats several
# times a second: each HTTP request (agents' heartbeats), each task run and each beat tick.
LOG_LEVEL = env("LOG_LEVEL", "INFO").upper()
_REPEATING_LEVEL = "DEBUG" if LOG_LEVEL == "DEBUG" else "WARNING"
# Django's own "django" logger prints to a console of its own while DEBUG is on, and then
# passes the record to the root's: every warning of Django's appeared twice. Here it only
# passes them on. A refused request (403) is one line without its traceback.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"one_line_refusal": {"()": "nomadgpu.log_filters.OneLineRefusal"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"handlers": [], "propagate": True},
        "django.request": {"filters": ["one_line_refusal"]},
        **{
            name: {"level": _REPEATING_LEVEL}
            for name in (
                "django.server",  # runserver's line per request
                "httpx",  # a line per provider or storage call
                "celery.app.trace",  # "Task ... succeeded"
                "celery.worker.strategy",  # "Task ... received"
                "celery.beat",  # "Scheduler: Sending due task"
            )
        },
    },
}
