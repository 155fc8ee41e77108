"""Where a job can run: the devices workers announce (lethe.worker.devices), and the job's least memory, from the
checkpoint's safetensors headers (read through the artifact store: a local file, or two Range reads on S3) and
the job's precision. A job goes to the queue of the smallest device it fits; one that fits none is refused with
the estimate. Only what a job needs whatever its records is counted here (weights, and in full fine-tuning the
gradients, optimiser state and frozen copy): the worker, which knows the records' lengths, checks the rest before
it loads the model (lethe.engine.model.memory_check)."""
from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from lethe.engine.contract.memory_plan import HEADROOM, ModelShape, Workload, lower_bound, safetensors_parameters
from lethe.engine.contract.model_files import MAX_HEADER_BYTES
from lethe.engine.job_spec import JobSpec
from lethe.service.domain.errors import Problem
from lethe.service.infra.artifacts import ArtifactStore
from lethe.service.infra.tables import ModelVersion, WorkerDevice, utcnow
from lethe.service.settings import Settings

NO_HEADERS = -1  # version.parameters when its files hold no readable safetensors header (a .bin checkpoint)


def version_parameters(store: ArtifactStore, version: ModelVersion) -> int | None:
    """Parameters of a version: read from its headers once (at registration, or at its first job), then kept in its
    row, so a submission reads no file. None where it has no safetensors headers."""
    if version.parameters is None:
        counted = checkpoint_parameters(store, version)
        version.parameters = NO_HEADERS if counted is None else counted
    return None if version.parameters == NO_HEADERS else version.parameters


def checkpoint_parameters(store: ArtifactStore, version: ModelVersion) -> int | None:
    """Parameters of a version from its safetensors headers (each at most MAX_HEADER_BYTES); None where it has none
    (a .bin checkpoint)."""
    headers = []
    for entry in version.manifest:
        if not entry["path"].endswith(".safetensors"):
            continue
        with store.open(version.location, entry["path"]) as handle:
            size = int.from_bytes(handle.read(8), "little")
            if not 0 < size <= MAX_HEADER_BYTES:
                return None
            try:
                headers.append(json.loads(handle.read(size)))
            except ValueError:
                return None
    return safetensors_parameters(headers) if headers else None


def fresh_devices(session: Session, settings: Settings) -> list[WorkerDevice]:
    since = utcnow() - timedelta(seconds=settings.device_seen_seconds)
    return list(session.scalars(select(WorkerDevice).where(WorkerDevice.seen_at >= since)))


def route(session: Session, spec: JobSpec, version: ModelVersion, store: ArtifactStore, settings: Settings) -> str:
    """The queue the job goes to; a Problem (422 does-not-fit) where no announced device holds it."""
    devices = fresh_devices(session, settings)
    params = spec.params
    if not devices or params is None:
        return settings.queue  # nothing announced: the worker checks at start
    parameters = version_parameters(store, version)
    if parameters is None:
        return settings.queue
    shape = ModelShape(parameters=parameters, hidden=1, layers=1, heads=1, intermediate=1, vocab=1)
    plans = []
    for device in sorted(devices, key=lambda d: d.capacity_bytes):
        dtype = device.auto_dtype if params.dtype == "auto" else params.dtype
        # lora "auto" falls back to LoRA where full fine-tuning does not fit: LoRA's bound is the one that refuses.
        work = Workload(dtype=dtype, lora=params.lora is not False, train_rows=0, eval_rows=0, max_tokens=0)
        plan = lower_bound(shape, work, device.capacity_bytes)
        if plan.fits:
            return device.queue
        plans.append((device, plan))
    device, plan = plans[-1]  # the largest device
    gib = plan.peak_bytes / 2**30
    tries = [t for t, useful in (('dtype "bfloat16"', params.dtype in ("auto", "float32")),
                                 ("LoRA", params.lora is False)) if useful]
    raise Problem(422, "does-not-fit", "Job does not fit",
                  f"the model's {parameters:,} parameters alone need {gib:.2f} GiB "
                  f"({', '.join(f'{k} {v / 2**30:.2f} GiB' for k, v in plan.parts.items())}) before any activation; "
                  f"the largest worker device ({device.device} on queue {device.queue}) lets a job plan on "
                  f"{device.capacity_bytes / HEADROOM / 2**30:.2f} GiB. Try "
                  f"{', '.join(tries + ['a worker with more memory'])}",
                  estimate={**plan.as_dict(), "parameters": parameters})
