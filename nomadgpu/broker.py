"""The embedded broker: kombu's filesystem transport, with messages written atomically.

kombu's own ``_put`` creates ``<name>.msg`` and then writes into it; its file lock is advisory
and ``_get`` does not take it, so a consumer can move and read a message between the two and
die on an empty payload ("Unrecoverable error: JSONDecodeError"), taking the worker down. Here
a message is written under a name the consumer skips and renamed into place, which is atomic
on one filesystem. ``nomadgpu.celery`` registers this class for ``filesystem://``.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: _get matches "<anything>.<queue>.msg" after the first dot, which the
        # partial name never does.
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        with open(partial, "wb") as out:
            out.write(str_to_bytes(dumps(payload)))
        os.replace(partial, final)


class Transport(filesystem.Transport):
    Channel = Channel


def register() -> None:
    """Make ``filesystem://`` URLs use this transport (kombu resolves schemes by alias)."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["filesystem"] = "nomadgpu.broker:Transport"
