"""``{% team_channels team %}``: a team's notification channels as a portal card."""

from __future__ import annotations

from django import template

from notify.models import Channel, EventKind

register = template.Library()


@register.inclusion_tag("notify/team_channels.html")
def team_channels(team) -> dict:
    labels = dict(EventKind.choices)
    channels = [
        (channel, [labels.get(kind, kind) for kind in channel.event_kinds or []])
        for channel in Channel.objects.filter(team=team)
    ]
    return {"team": team, "channels": channels}
