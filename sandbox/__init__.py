"""The sandbox marketplace: a local Vast.ai look-alike reached over HTTP only (see README.md).

Another program, not part of NomadGPU's apps: it speaks Vast's REST API
(``docs/vast-api.md``) and its "instances" are local process groups running the real agent.
No app imports it (``manage.py sandbox`` runs ``python -m sandbox``) and it imports no app and
no Django (``.importlinter``). Standard library only. What each part answers:

- ``cli`` (``__main__``): the command line: ``serve``, ``inject``, ``instances``.
- ``server``: the app and each request's way through it (route, rate limit, auth, handler).
- ``routes``: which handler answers a request; ``messages``: what a request carries in and how
  a reply goes out.
- ``vast_api``: Vast's endpoints; ``sandbox_api``: the sandbox-only ones under ``/sandbox/``.
- ``errors``: the error answered in Vast's shape.
- ``engine/``: every instance state transition, one concern per file (its own docstring).
- ``views``: instances as Vast serves them (one object, the v1 list).
- ``market`` (and ``market/``, the offers): the offers and their search; ``query``: Vast's
  filter language.
- ``bids``: the interruptible market (the ``min_bid`` walk, other tenants' outbids).
- ``billing``: usage integrated into charges and the credit; ``payments``: v1 invoices.
- ``traffic``: metered downloads, uploads and the instances' proxy.
- ``image_cache``: images a machine keeps between rentals; ``timing``: how long things take.
- ``processes``: an instance's processes; ``gpu``: the fake ``nvidia-smi``.
- ``ratelimit``: Vast's per-endpoint minimum intervals; ``state``: the SQLite state.
"""
