"""Who is speaking: the live attempt holding an agent's bearer token (``nomadgpu.tokens``), or
why there is none, which the API answers 401 (unknown), 503 (not recorded as rented yet) or 410
(ended: the agent must stop, fencing).

A hedged rent's racer (``jobs.models.racer``) holds a token of its own until its race is
decided: its register wins the race (``jobs.renting.race_end.win``: its token becomes the
attempt's), its bootstrap may fetch the agent meanwhile, and anything else waits (503) until
it has registered. Once its race is over its token is dead (410): its agent stops.
"""

from __future__ import annotations

from django.utils import timezone

from jobs.agent_api import heartbeat_store
from jobs.models import ON_HOST_STATES, Attempt, AttemptState, Racer, RacerState
from jobs.renting import race_end
from nomadgpu.tokens import token_matches, token_prefix

# Every agent call authenticates, so the lookup leaves out what most calls never read: the
# team (its sealed secrets cost a decryption each) loads on first use, and so does the job's
# sealed data key (register only). A heartbeat reads even less (``heartbeat_store``).
AUTH_DEFERRED = ("log_tail", "decision", "job__data_key")


class TokenUnknown(Exception):
    """No attempt holds this token."""


class TokenDead(Exception):
    """The attempt behind this token has ended: the agent must stop (fencing)."""


class AttemptNotRentedYet(Exception):
    """The agent's instance exists but the supervisor has not recorded it: the create's answer
    was lost and the reconciler adopts the instance by its label shortly. The agent must wait,
    not stop: stopping would leave the adopted host without an agent."""


# What a racer's token may do before its race is decided (``authenticate_agent``'s RACER).
RACER_WINS = "wins"  # register: the first racer to register gets the attempt
RACER_FETCHES = "fetches"  # the bootstrap's agent download: no state changes


def authenticate_agent(
    token: str, *, for_heartbeat: bool = False, racer: str | None = None
) -> Attempt:
    """The live attempt holding TOKEN; raises TokenUnknown, AttemptNotRentedYet or TokenDead.

    Loaded: everything but ``AUTH_DEFERRED``, or with FOR_HEARTBEAT only what a heartbeat
    reads (``heartbeat_store.load_for_heartbeat``). Other fields load on first use, one query
    each. A racer's token (none of an attempt's) is answered by RACER: ``RACER_WINS`` wins
    its race, ``RACER_FETCHES`` passes as its attempt; otherwise 503 until it has won."""
    prefix = token_prefix(token)
    if for_heartbeat:
        attempt = heartbeat_store.load_for_heartbeat(prefix)
    else:
        attempts = Attempt.objects.select_related("job").defer(*AUTH_DEFERRED)
        attempt = attempts.filter(token_prefix=prefix).order_by().first()
    if attempt is None:
        return _racer_checked(prefix, token, racer=racer)
    return _token_checked(attempt, token)


def _racer_checked(prefix: str, token: str, *, racer: str | None) -> Attempt:
    """The attempt a racer's TOKEN races for, as RACER allows (``authenticate_agent``)."""
    found = Racer.objects.select_related("attempt__job").filter(token_prefix=prefix).first()
    if found is None or not token_matches(token, found.token_digest):
        raise TokenUnknown
    if not found.is_open:
        raise TokenDead(found.end_reason or found.state)
    if racer == RACER_FETCHES:
        return found.attempt
    if racer != RACER_WINS or found.state != RacerState.RACING:
        raise AttemptNotRentedYet  # not adopted yet, or a call before its register: wait
    try:
        return race_end.win(found.pk, now=timezone.now())
    except race_end.RaceOver as exc:
        raise TokenDead(str(exc)) from exc


def _token_checked(attempt: Attempt | None, token: str) -> Attempt:
    """ATTEMPT if TOKEN is its token and it is live; raises TokenUnknown, AttemptNotRentedYet or
    TokenDead otherwise (what the agent API answers 401, 503 and 410)."""
    if attempt is None or not token_matches(token, attempt.token_digest):
        raise TokenUnknown
    if attempt.state == AttemptState.REQUESTED:
        raise AttemptNotRentedYet
    if attempt.state not in ON_HOST_STATES:
        raise TokenDead(attempt.end_reason or attempt.state)
    return attempt
