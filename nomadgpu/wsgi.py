import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nomadgpu.settings")

application = get_wsgi_application()

# gunicorn runs no system checks: refuse to serve with a key that cannot open team secrets.
from nomadgpu.checks import verify_sealed_secrets_or_exit  # noqa: E402

verify_sealed_secrets_or_exit()

# The agent API tells the watchdog it is up (nomadgpu.ingest): its own outage is never a host's.
# The URLconf (every view module) is imported first: Django does it lazily, on the first request,
# and the beacon's first write after an outage says the agent API takes heartbeats again.
from django.urls import get_resolver  # noqa: E402

from nomadgpu.ingest import start_web_beacon  # noqa: E402

get_resolver().url_patterns  # noqa: B018
start_web_beacon()
