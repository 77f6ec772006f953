"""The one NinjaAPI. Each app adds its router here (agent API, member API)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import connection
from ninja import NinjaAPI, Schema

api = NinjaAPI(
    title="NomadGPU API",
    version="1",
    description="Member API (personal tokens) and agent API (per-attempt tokens).",
    urls_namespace="api",
)


api.add_router("/agent", "jobs.agent_api.api.router")
api.add_router("/jobs", "portal.member_api.router")
api.add_router("/workdirs", "portal.workdir_api.router")
api.add_router("/teams", "portal.secrets_api.router")


@api.exception_handler(RequestDataTooBig)
def request_too_big(request, exc):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return api.create_response(
        request, {"detail": f"request body is larger than {limit} bytes"}, status=413
    )


class HealthOut(Schema):
    ok: bool
    database: bool


@api.get("/health", response=HealthOut, auth=None, tags=["health"])
def health(request) -> HealthOut:
    """Liveness for load balancers and docker-compose health checks."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return HealthOut(ok=True, database=True)
