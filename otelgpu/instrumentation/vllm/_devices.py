"""Which physical GPUs one vLLM engine runs on, from its configuration.

A vLLM stat logger lives in the front-end process ("process0") and is told only the engine's
``VllmConfig`` and its data-parallel (DP) index; the model runs in worker processes that
inherit process0's ``CUDA_VISIBLE_DEVICES``. The mapping follows vLLM's placement rules:

* one engine uses ``world_size = tensor_parallel_size * pipeline_parallel_size`` GPUs
  (``ParallelConfig.world_size`` when present, which also counts context parallelism);
* DP engines on one node take consecutive slices of the CUDA-visible devices: local engine
  ``k`` (``engine_index mod data_parallel_size_local``) uses CUDA ordinals
  ``[k * world_size, (k + 1) * world_size)``;
* CUDA ordinals are positions in ``CUDA_VISIBLE_DEVICES`` (in CUDA's device order), which
  ``otelgpu.nvml`` already resolved into ``DeviceInfo.cuda_index`` -- NVML's own numbering
  differs and is never used here;
* a slice that runs past the visible devices (TP/PP spanning several nodes) is clipped to the
  GPUs of this node, the only ones this process can sample.

Pure functions, no vLLM import; the inputs are duck-typed so tests can pass plain objects.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

_logger = logging.getLogger("otelgpu.instrumentation.vllm")


@dataclass(frozen=True)
class EnginePlacement:
    """Where one engine runs, as far as this process can tell.

    Attributes:
        engine_index: vLLM's DP engine index.
        world_size: GPUs per engine (TP x PP [x CP]).
        tensor_parallel_size, pipeline_parallel_size, data_parallel_size: from the config.
        cuda_indices: the CUDA ordinals (positions among the visible devices) it uses.
    """

    engine_index: int
    world_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    cuda_indices: tuple[int, ...]


def _positive_int(obj: object, name: str, default: int) -> int:
    value = getattr(obj, name, None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return default


def engine_placement(vllm_config: object, engine_index: int, visible_count: int) -> EnginePlacement:
    """The CUDA ordinals of engine ``engine_index`` among ``visible_count`` visible GPUs."""
    parallel = getattr(vllm_config, "parallel_config", None)
    tp = _positive_int(parallel, "tensor_parallel_size", 1)
    pp = _positive_int(parallel, "pipeline_parallel_size", 1)
    dp = _positive_int(parallel, "data_parallel_size", 1)
    world = _positive_int(parallel, "world_size", tp * pp)
    dp_local = _positive_int(parallel, "data_parallel_size_local", 1)
    local_index = engine_index % dp_local if engine_index >= 0 else 0
    start = local_index * world
    chosen = tuple(range(start, min(start + world, visible_count)))
    if not chosen and visible_count > 0:
        # More local engines than visible slices: the config and the environment disagree.
        # Attributing every visible GPU is wrong in a knowable way; none would hide them all.
        _logger.warning(
            "otelgpu: vLLM engine %d needs CUDA devices %d..%d but only %d are visible "
            "(CUDA_VISIBLE_DEVICES); attributing all visible GPUs to it",
            engine_index,
            start,
            start + world - 1,
            visible_count,
        )
        chosen = tuple(range(visible_count))
    return EnginePlacement(
        engine_index=engine_index,
        world_size=world,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        cuda_indices=chosen,
    )


def visible_count(devices: Sequence[object]) -> int:
    """How many sampled devices are CUDA-visible (have a ``cuda_index``)."""
    return sum(1 for d in devices if isinstance(getattr(d, "cuda_index", None), int))


def resolve_uuids(cuda_indices: Sequence[int], devices: Sequence[object]) -> tuple[str, ...]:
    """The UUIDs of the sampled ``devices`` at the given CUDA ordinals, in ordinal order."""
    by_index: dict[int, str] = {}
    for device in devices:
        index = getattr(device, "cuda_index", None)
        uuid = getattr(device, "uuid", None)
        if isinstance(index, int) and isinstance(uuid, str):
            by_index.setdefault(index, uuid)
    return tuple(by_index[i] for i in cuda_indices if i in by_index)
