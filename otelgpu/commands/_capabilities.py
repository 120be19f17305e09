"""The GPU-capability section of ``otelgpu doctor``: what each GPU supports, and why not.

Opens a sampler briefly (one capability probe and one sample per device, nothing kept)
and reports the features otelgpu builds on -- GPM (SM / tensor / DRAM activity), the
energy counter, memory v2, HBM temperature, remapped rows, ECC, NVLink, XID events --
with NVML's reason for every one that is missing.
"""

from __future__ import annotations

from typing import TextIO

#: (field name in the sampler, what the user gets from it)
FEATURES: tuple[tuple[str, str], ...] = (
    ("gpm", "GPM: SM / tensor / DRAM / FP-pipe activity (per step and request)"),
    ("energy", "energy counter (joules per step / request)"),
    ("memory_reserved", "memory v2 (used without reserved, as nvidia-smi)"),
    ("memory_temperature", "HBM temperature"),
    ("remapped_rows", "remapped rows"),
    ("ecc_uncorrected", "ECC error counters"),
    ("pcie_replay", "PCIe replay counter"),
    ("nvlink_tx_bytes", "NVLink byte counters"),
    ("encoder_utilization", "encoder / decoder utilization"),
    ("clock_event_reasons", "clock-throttle reasons"),
)


def report_capabilities(out: TextIO) -> None:
    """Write one block per sampled GPU; never raises (a failure is printed)."""
    print("\n== GPU capabilities ==", file=out)
    try:
        from otelgpu.sampler import GpuSampler

        sampler = GpuSampler(interval_s=1.0, history_s=1.0)
    except Exception as exc:  # noqa: BLE001 - diagnose, don't crash
        print(f"  cannot open a sampler: {exc}", file=out)
        return
    try:
        if not sampler.devices:
            print(f"  no GPU to probe ({sampler.error or 'none visible'})", file=out)
            return
        sampler.sample_once()
        for device in sampler.devices:
            print(f"  {device.uuid} ({device.name})", file=out)
            d = device.details
            print(
                f"    VBIOS {d.vbios_version or '?'}, serial {d.serial or 'not readable'}, "
                f"slowdown {d.slowdown_temp_c or '?'} C, shutdown {d.shutdown_temp_c or '?'} C",
                file=out,
            )
            supported = set(sampler.supported_fields(device.uuid))
            why = sampler.unsupported_fields(device.uuid)
            for field, label in FEATURES:
                if field in supported:
                    print(f"    {label}: yes", file=out)
                else:
                    print(f"    {label}: no -- {why.get(field, 'not readable now')}", file=out)
        events = "yes" if sampler.events_supported else "no (NVML event API unavailable)"
        print(f"  XID events: {events}", file=out)
    finally:
        sampler.close()
