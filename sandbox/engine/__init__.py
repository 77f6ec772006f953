"""The engine: every state transition of the sandbox's instances, one concern per file.

``Engine`` is one class assembled from mixins, each over the same instance table, store and
clock (``EngineCore``). Mixins rather than collaborators, because the concerns do not separate
their state: every one of them changes the same row through ``_update`` inside one store
transaction, and they call each other (an outbid stops the container, a start may find its bid
outbid, a regained bid loads the image, a tick brings rebooted hosts back). Collaborators would
each hold references to the others; the mixins keep one object with each concern's methods in
its own file. The state that does separate already lives in collaborators: the bid market
(``sandbox/bids.py``), the processes (``sandbox/processes.py``), the store (``sandbox/state.py``).

- ``core``: an instance row, its lookups, and ``_update``, the one place a row changes.
- ``usage``: what is billed at each moment (usage intervals) and the traffic records.
- ``create_body``: what a create body may hold, and the script the container runs.
- ``create``: whether an ask can be rented, and the row a new instance starts as.
- ``buyer_hazards``: a second buyer of one ask accepted, a create answered 504 after it made
  its instance (armed by hand: the hazards a renter must guard against).
- ``phases``: created → loading → running, the onstart script, an exit on its own.
- ``images``: where the image comes from (pulled, cached on the machine, wiped); a pull's bill.
- ``renter_actions``: the renter's destroy, stop, start, label and reboot.
- ``outbids``: when a bid loses its machine and when it wins it back; change bid; the bid tick.
- ``weather_fates``: the market weather played out: fates drawn at create, the real link, a
  rental that never runs, hosts lost while loading, downloading or running; loading progress.
- ``faults``: failure injection, and the faults of one container or contract.
- ``host_outages``: hosts cut off, gone or rebooting, and back; destroys queued for them.
- ``upkeep``: the ticker, credit and contract ends, restart and shutdown.
- ``debug_view``: the sandbox-only view of one instance.
"""

from __future__ import annotations

from sandbox.engine.create import Create
from sandbox.engine.debug_view import DebugView
from sandbox.engine.faults import Faults
from sandbox.engine.host_outages import HostOutages
from sandbox.engine.images import Images
from sandbox.engine.outbids import Outbids
from sandbox.engine.phases import Phases
from sandbox.engine.renter_actions import RenterActions
from sandbox.engine.upkeep import Upkeep
from sandbox.engine.weather_fates import WeatherFates


class Engine(
    Create,
    Phases,
    Images,
    WeatherFates,
    RenterActions,
    Outbids,
    Faults,
    HostOutages,
    Upkeep,
    DebugView,
):
    """All instance state transitions. Thread-safe: each one is a store transaction."""
