"""Launching a sharded run (lethe.engine.model.sharding): one process per device, each running the same run_unlearning
under FSDP; rank 0's progress is relayed to the caller, a cancellation reaches every process, rank 0 writes the
result document and the checkpoint to `workdir`."""
from __future__ import annotations

import json
import os
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lethe.engine.contract.parameters import SharedParams
from lethe.engine.model.sharding import agreed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _process(index: int, processes: int, port: int, args: dict, workdir: str, messages, cancelled) -> None:
    from lethe.engine.model.loading import save_model
    from lethe.engine.unlearn import run_unlearning

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args["device"] not in ("cpu",) and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(index)
    dist.init_process_group("nccl" if cuda else "gloo", rank=index, world_size=processes)
    device = f"cuda:{index}" if cuda else "cpu"
    try:
        outcome = run_unlearning(
            args["source"], args["forget"], args["retain"], params=args["params"], holdout=args["holdout"],
            device=device, format=args["format"], memory_limit=args["memory_limit"],
            progress=(lambda p: messages.put(("progress", p))) if index == 0 else None,
            should_cancel=lambda: agreed(cancelled.is_set(), torch.device(device)))
        if index == 0:
            if outcome.model is not None:
                save_model(outcome.model, outcome.tokenizer, Path(workdir) / "model")
            (Path(workdir) / "result.json").write_text(json.dumps(outcome.result.as_dict()))
    except BaseException as exc:
        if index == 0:
            messages.put(("error", (type(exc).__name__, str(exc), getattr(exc, "field", None))))
        raise
    finally:
        dist.destroy_process_group()


def run_sharded(source: str, forget: list[dict], retain: list[dict] | None, *, params: SharedParams, processes: int,
                workdir: str | Path, holdout: list[dict] | None = None, device: str = "cuda",
                progress: Callable[[dict], None] | None = None, should_cancel: Callable[[], bool] | None = None,
                format: str = "plain", memory_limit: int | None = None) -> dict:
    """Full fine-tuning sharded over `processes` processes; returns rank 0's result document, the checkpoint in
    `workdir`/model. `memory_limit` is per process (one device each)."""
    from lethe.engine.contract.errors import EngineInputError

    if params.lora is not False:
        raise EngineInputError("FSDP shards full fine-tuning; LoRA jobs shard with a device map", field="lora")
    context = mp.get_context("spawn")
    messages, cancelled = context.Queue(), context.Event()
    args = {"source": source, "forget": forget, "retain": retain, "params": params, "holdout": holdout,
            "device": device, "format": format, "memory_limit": memory_limit}
    workers = mp.start_processes(_process, args=(processes, _free_port(), args, str(workdir), messages, cancelled),
                                 nprocs=processes, join=False, start_method="spawn")
    errors: list = []
    done = threading.Event()

    def relay() -> None:
        while not done.is_set():
            if should_cancel is not None and should_cancel():
                cancelled.set()
            try:
                kind, body = messages.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "progress" and progress is not None:
                progress(body)
            elif kind == "error":
                errors.append(body)

    relayer = threading.Thread(target=relay, daemon=True)
    relayer.start()
    try:
        while not workers.join():
            pass
    except Exception:
        if errors:
            name, message, field = errors[0]
            if name in ("DoesNotFit", "EngineInputError"):
                raise EngineInputError(message, field=field) from None
        raise
    finally:
        done.set()
        relayer.join(timeout=5)
    return json.loads((Path(workdir) / "result.json").read_text())
