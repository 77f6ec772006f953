from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from nomadgpu import crypto
from nomadgpu.admin_scoping import SecretFieldsForm, TeamScopedAdmin, clear_secret_field
from notify import outbox
from notify.models import Channel, ChannelKind, Delivery, DeliveryState, EventKind


class ChannelForm(SecretFieldsForm):
    secret_fields = Channel.SECRET_FIELDS
    event_kinds = forms.MultipleChoiceField(
        choices=EventKind.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        initial=EventKind.values,
        label="Events",
    )
    clear_telegram_bot_token = clear_secret_field("bot token")
    clear_webhook_secret = clear_secret_field("webhook secret")

    class Meta:
        model = Channel
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if data.get("kind") == ChannelKind.TELEGRAM:
            self._require_telegram(data)
        elif data.get("kind") == ChannelKind.WEBHOOK:
            self._require_webhook(data)
        return data

    def _require_telegram(self, data: dict) -> None:
        if not data.get("chat_id"):
            self.add_error("chat_id", "A Telegram channel needs the chat id to write to.")
        team = data.get("team")
        if not data.get("telegram_bot_token") and not (team and team.telegram_bot_token):
            self.add_error("telegram_bot_token", "Set a bot token here or on the team.")

    def _require_webhook(self, data: dict) -> None:
        if not data.get("webhook_url"):
            self.add_error("webhook_url", "A webhook channel needs the URL to POST to.")
        if len(data.get("webhook_secret") or "") < 16:
            self.add_error(
                "webhook_secret",
                "Set a signing secret of at least 16 characters (the receiver checks the "
                'signature with it), e.g. python -c "import secrets; print(secrets.token_hex(32))"',
            )


@admin.register(Channel)
class ChannelAdmin(TeamScopedAdmin):
    form = ChannelForm
    list_display = ["name", "team", "kind", "enabled", "target", "events", "disabled_reason"]
    list_filter = ["kind", "enabled", ("team", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "chat_id", "webhook_url", "disabled_reason"]
    list_select_related = ["team"]
    readonly_fields = ["disabled_reason", "disabled_at", "created_at"]
    actions = ["send_test_message"]
    fieldsets = [
        (None, {"fields": ["team", "name", "kind", "enabled", "event_kinds"]}),
        (
            "Telegram",
            {"fields": ["chat_id", "telegram_bot_token", "clear_telegram_bot_token"]},
        ),
        ("Webhook", {"fields": ["webhook_url", "webhook_secret", "clear_webhook_secret"]}),
        ("Status", {"fields": ["disabled_reason", "disabled_at", "created_at"]}),
    ]

    @admin.display(description="sends to")
    def target(self, channel: Channel) -> str:
        if channel.kind == ChannelKind.TELEGRAM:
            token = "own bot" if channel.telegram_bot_token else "team's bot"
            return f"chat {channel.chat_id} ({token})"
        return f"{channel.webhook_url} (secret {crypto.mask(channel.webhook_secret)})"

    @admin.display(description="events")
    def events(self, channel: Channel) -> str:
        return f"{len(channel.event_kinds or [])} of {len(EventKind.values)}"

    def save_model(self, request, obj: Channel, form, change: bool) -> None:
        if obj.enabled:  # switched back on by a person: the old reason no longer holds
            obj.disabled_reason, obj.disabled_at = "", None
        super().save_model(request, obj, form, change)

    @admin.action(description="Send a test message to the selected channels")
    def send_test_message(self, request, queryset) -> None:
        for channel in queryset.select_related("team"):
            error = outbox.send_trial(channel)
            if error is None:
                self.message_user(request, f"{channel}: test message sent.", messages.SUCCESS)
            else:
                self.message_user(request, f"{channel}: not sent: {error}", messages.ERROR)


@admin.register(Delivery)
class DeliveryAdmin(TeamScopedAdmin):
    team_path = "channel__team"
    list_display = [
        "created_at",
        "event_kind",
        "job",
        "channel",
        "state",
        "attempts",
        "next_attempt_at",
        "sent_at",
        "last_error",
    ]
    list_filter = [
        "state",
        ("channel", admin.RelatedOnlyFieldListFilter),
        "channel__kind",
        "event__kind",
    ]
    search_fields = ["event__job__name", "last_error", "channel__name"]
    list_select_related = ["channel", "event__job"]
    readonly_fields = [f.name for f in Delivery._meta.fields]
    date_hierarchy = "created_at"
    actions = ["retry_now"]

    @admin.display(description="event", ordering="event__kind")
    def event_kind(self, delivery: Delivery) -> str:
        return delivery.event.kind

    @admin.display(description="job")
    def job(self, delivery: Delivery) -> str:
        return str(delivery.event.job)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # the outbox's own history: read only

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Send the selected failed deliveries again")
    def retry_now(self, request, queryset) -> None:
        retried = queryset.filter(state=DeliveryState.FAILED, channel__enabled=True).update(
            state=DeliveryState.PENDING, attempts=0, next_attempt_at=timezone.now()
        )
        self.message_user(request, f"{retried} deliveries will be sent again shortly.")
