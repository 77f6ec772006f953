import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nomadgpu.settings")

application = get_wsgi_application()

# gunicorn runs no system checks: refuse to serve with a key that cannot open team secrets.
from nomadgpu.checks import verify_sealed_secrets_or_exit  # noqa: E402

verify_sealed_secrets_or_exit()
