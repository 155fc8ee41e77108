"""What a run records about where it ran: seeds, peak memory, library versions."""
from __future__ import annotations

import platform
import random
import subprocess
import weakref
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too


class PeakMemory:
    """Peak memory of a run: CUDA's allocator peak, or on CPU the process's peak RSS (VmHWM),
    which Linux lets us reset through /proc/self/clear_refs so the figure is this run's alone."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.resettable = True
        except OSError:
            self.resettable = False

    def read(self) -> dict:
        if self.device.type == "cuda":
            return {"bytes": torch.cuda.max_memory_allocated(self.device), "kind": "cuda_max_allocated"}
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                kind = "cpu_peak_rss" if self.resettable else "cpu_peak_rss_since_process_start"
                return {"bytes": int(line.split()[1]) * 1024, "kind": kind}
        return {"bytes": None, "kind": "unavailable"}


class TensorMemory(TorchDispatchMode):
    """The bytes held by live tensors, and their peak, while the mode is on: every storage an operator returns
    is counted once (views share it) until it is freed. On CPU this is what CUDA's allocator peak is on a GPU:
    weights, adapters, gradients, optimiser state and activations, without the Python process around them.
    Costs a Python call per operator: for benchmarks and tests, not for jobs."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                self._count(value.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if key == 0 or key in self.live:
            return
        self.live[key] = storage.nbytes()
        self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak = self.current


def library_versions() -> dict:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("lethe", "torch", "transformers", "peft", "tokenizers", "safetensors"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["code_commit"] = _git_commit()
    return versions


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
