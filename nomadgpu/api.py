"""The one NinjaAPI. Each app adds its router here (agent API, member API)."""

from __future__ import annotations

from django.db import connection
from ninja import NinjaAPI, Schema

api = NinjaAPI(
    title="NomadGPU API",
    version="1",
    description="Member API (personal tokens) and agent API (per-attempt tokens).",
    urls_namespace="api",
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
