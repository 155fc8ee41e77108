"""What a run records about where it ran: seeds, peak memory, library versions."""
from __future__ import annotations

import platform
import random
import subprocess
from importlib import metadata
from pathlib import Path

import torch


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
