from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from nomadgpu.models import Membership
from nomadgpu.services import sync_staff_access


@receiver(post_save, sender=Membership)
@receiver(post_delete, sender=Membership)
def _membership_changed(sender, instance: Membership, **kwargs) -> None:
    sync_staff_access(instance.user)
