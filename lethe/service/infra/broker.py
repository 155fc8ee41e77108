"""The embedded mode's broker: kombu's filesystem transport, with message files named so that they sort
in the order they were sent. kombu names them by unpadded uptime in milliseconds and takes the smallest
name first, so once uptime gains a digit (16.7 minutes after boot in a fresh container) older messages
sort behind newer ones: a re-sent job waited 183 s behind later ones (issue 12)."""
from __future__ import annotations

import itertools
import os
import time
import uuid

from kombu.transport import filesystem

ORDER = itertools.count()


class Channel(filesystem.Channel):
    # kombu's own bases disagree on the argument's name (message, payload): this follows filesystem.Channel.
    def _put(self, queue, payload, **kwargs):  # type: ignore[override]
        """As kombu's, with a fixed-width name: wall-clock nanoseconds, then a per-process counter."""
        name = f"{time.time_ns():020d}{next(ORDER) % 10**6:06d}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(self.data_folder_out, name)
        with open(path, "wb", buffering=0) as handle:
            filesystem.lock(handle, filesystem.LOCK_EX)
            try:
                handle.write(filesystem.str_to_bytes(filesystem.dumps(payload)))
            finally:
                filesystem.unlock(handle)


class Transport(filesystem.Transport):
    Channel = Channel


TRANSPORT = "lethe.service.infra.broker:Transport"
