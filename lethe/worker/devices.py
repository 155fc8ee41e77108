"""A worker process announces its device: the queue it serves, the memory its jobs may plan on, and what dtype
"auto" means there (lethe.service.domain.capacity routes and refuses jobs by it). Renewed every
LETHE_DEVICE_REFRESH_SECONDS by a thread, and deleted when the process ends."""
from __future__ import annotations

import logging
import os
import socket
import threading

from lethe.service.infra.db import session_scope
from lethe.service.infra.tables import WorkerDevice, utcnow
from lethe.service.settings import Settings, get_settings

log = logging.getLogger("lethe.worker")


def device_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def memory_limit(settings: Settings) -> int | None:
    """The bytes a job may plan on: the operator's setting, else what the devices hold (every visible GPU together:
    a job larger than one is placed over them; None: unknown). The engine plans per device itself."""
    if settings.device_memory_bytes > 0:
        return settings.device_memory_bytes
    from lethe.engine.model.device_map import visible_gpus
    from lethe.engine.model.loading import resolve_device
    from lethe.engine.model.memory_check import device_capacity

    device = resolve_device(settings.device)
    return sum(visible_gpus()) if device.type == "cuda" else device_capacity(device)


def announce(settings: Settings) -> None:
    from lethe.engine.model.loading import resolve_device
    from lethe.engine.model.precision import default_dtype

    device = resolve_device(settings.device)
    capacity = memory_limit(settings)
    if capacity is None:
        return  # nothing to announce: the API routes to the default queue and the worker checks at start
    with session_scope() as session:
        row = session.get(WorkerDevice, device_id())
        if row is None:
            row = WorkerDevice(id=device_id())
            session.add(row)
        row.queue, row.device, row.capacity_bytes = settings.queue, str(device), capacity
        row.auto_dtype, row.seen_at = default_dtype(device), utcnow()


def withdraw() -> None:
    try:
        with session_scope() as session:
            row = session.get(WorkerDevice, device_id())
            if row is not None:
                session.delete(row)
    except Exception:  # the process is ending; a stale row is ignored after LETHE_DEVICE_SEEN_SECONDS
        log.exception("could not withdraw the device announcement")


class Announcer(threading.Thread):
    def __init__(self, settings: Settings):
        super().__init__(name="lethe-device", daemon=True)
        self.settings, self.stopped = settings, threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                announce(self.settings)
            except Exception:  # the database may be down for a while: try again at the next round
                log.exception("could not announce the device")
            self.stopped.wait(self.settings.device_refresh_seconds)


def start_announcer() -> Announcer:
    announcer = Announcer(get_settings())
    announcer.start()
    return announcer
