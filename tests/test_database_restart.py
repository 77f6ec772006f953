"""After a database restart, a kept connection is replaced before it is used
(``CONN_HEALTH_CHECKS``): the first request or task after it does not fail on a dead one."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from nomadgpu.models import ServiceHeartbeat


@pytest.mark.needs_postgres
@pytest.mark.django_db(transaction=True)
def test_a_kept_connection_killed_by_a_restart_is_replaced_before_the_next_query():
    ServiceHeartbeat.objects.count()  # a connection kept between requests (CONN_MAX_AGE)
    pid = connection.connection.info.backend_pid
    other = connections.create_connection("default")  # the server ending it, as a restart does
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()

    # What Django does at the start of each request and Celery task.
    connection.close_if_unusable_or_obsolete()

    assert ServiceHeartbeat.objects.count() == 0
    assert connection.connection.info.backend_pid != pid
