"""What a team stores once, by content, for its jobs: packed code (``WorkdirPack``) and
staged model weights (``StagedObject``)."""

from __future__ import annotations

import hashlib

from django.db import models
from django.utils import timezone

from nomadgpu.fields import EncryptedTextField
from nomadgpu.models import Team


class WorkdirPackState(models.TextChoices):
    UPLOADING = "uploading", "Uploading"
    READY = "ready", "Ready"


class WorkdirPack(models.Model):
    """A team's packed code folder (a gzipped tar), stored once by content: the sha256 of the
    pack (before encryption) names it, so submitting unchanged code uploads nothing. An
    encrypted pack (for jobs that encrypt their checkpoints) is ngck1 under its own data key,
    sealed here; agents get the key over their register call."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="workdir_packs")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField(help_text="bytes of the pack before encryption")
    encrypted = models.BooleanField(default=False)
    # The object as stored (ngck1 bytes when encrypted, else the pack itself): what an agent
    # downloads and verifies.
    stored_sha256 = models.CharField(max_length=64, blank=True)
    stored_size = models.PositiveBigIntegerField(null=True, blank=True)
    data_key = EncryptedTextField(blank=True)
    state = models.CharField(
        max_length=12, choices=WorkdirPackState.choices, default=WorkdirPackState.UPLOADING
    )
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "sha256", "encrypted"], name="one_pack_per_content"
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.team.slug} code {self.sha256[:12]} ({self.size} B)"

    @property
    def key(self) -> str:
        """Where it lies in the team's storage."""
        suffix = "tar.gz.ngck1" if self.encrypted else "tar.gz"
        return f"teams/{self.team.slug}/workdirs/{self.sha256}.{suffix}"


class StagedObjectState(models.TextChoices):
    MIRRORING = "mirroring", "Mirroring"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class StagedObject(models.Model):
    """One ``stage`` entry mirrored into a team's storage, once: a Hugging Face repo at one
    resolved commit (with the file globs asked for), or one URL. ``source`` names it
    (``hf:ORG/NAME@COMMIT:GLOBS`` or ``url:URL``), so a second job with the same entry reuses
    it. ``files`` lists what is stored: ``{path, size, sha256, etag, key, stored_size,
    stored_sha256}`` each; ``data_key`` (sealed) encrypts them all for jobs that encrypt."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="staged_objects")
    kind = models.CharField(max_length=4)  # "hf" | "url"
    source = models.CharField(max_length=600)
    encrypted = models.BooleanField(default=False)
    repo = models.CharField(max_length=200, blank=True)
    revision = models.CharField(max_length=255, blank=True)
    commit = models.CharField(max_length=64, blank=True)
    files = models.JSONField(default=list, blank=True)
    state = models.CharField(
        max_length=10, choices=StagedObjectState.choices, default=StagedObjectState.MIRRORING
    )
    error = models.TextField(blank=True)
    files_total = models.PositiveIntegerField(default=0)
    files_done = models.PositiveIntegerField(default=0)
    bytes_total = models.PositiveBigIntegerField(default=0)
    bytes_done = models.PositiveBigIntegerField(default=0)
    data_key = EncryptedTextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "source", "encrypted"], name="one_staged_object_per_source"
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.team.slug} staged {self.source[:80]}"

    @property
    def prefix(self) -> str:
        """Where its files lie in the team's storage: by content (the resolved commit, or a
        digest of the URL), never by job."""
        digest = hashlib.sha256(f"{self.source}:{self.encrypted}".encode()).hexdigest()[:24]
        return f"teams/{self.team.slug}/stage/{digest}/"
