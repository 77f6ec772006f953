"""Production settings plus one bench-only URL (the heartbeat bench's baseline view)."""

from nomadgpu.settings import *  # noqa: F403

ROOT_URLCONF = "bench.support.site_urls"
