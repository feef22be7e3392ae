"""The KV budget: what --kv-cache-mb defaults to, and the error for a prompt that can never fit it."""

from __future__ import annotations

import os

import torch

from engine.slot_cache import KVShape


class PromptTooLong(ValueError):
    """A prompt whose KV can never fit the KV budget or the context; the server answers 400."""


def default_kv_budget(device: torch.device, shape: KVShape, max_batch: int, context_length: int) -> int:
    """What --kv-cache-mb defaults to: room for every row at full context where memory allows it,
    else 80% of the accelerator's free memory (after the weights) or a quarter of the host's
    available memory."""
    full = max_batch * context_length * shape.bytes_per_token
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return min(full, int(free * 0.8))
    return min(full, _available_ram() // 4)


def _available_ram() -> int:
    """Memory the host can give without swapping: Linux's MemAvailable (free memory plus the page
    cache it can drop; free pages alone are far less on a machine that has read files), else free
    pages, else 8 GiB."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30
