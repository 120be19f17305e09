"""Built-in GPU models of the simulator: realistic defaults a scenario starts from.

Every key here is a device key of the scenario format (docs/simulator.md); a scenario's
``[gpus]`` table or a ``[[gpu]]`` entry may override any of them. Numbers follow the
public spec sheets (board power, memory, boost clocks) and what ``nvidia-smi -q``
prints on such boards; they are plausible, not measured.
"""

from __future__ import annotations

from typing import Any

#: NVML architecture numbers (``nvmlDeviceGetArchitecture``).
ARCHITECTURES: dict[str, int] = {
    "kepler": 2,
    "maxwell": 3,
    "pascal": 4,
    "volta": 5,
    "turing": 6,
    "ampere": 7,
    "ada": 8,
    "hopper": 9,
    "blackwell": 10,
}

_COMMON: dict[str, Any] = {
    "reserved_mib": 512,
    "ambient_c": 30.0,
    "thermal_tau_s": 20.0,
    "thermal_clock_factor": 0.7,
    "unsupported": [],
    "ecc_aggregate_corrected": 0,
    "ecc_aggregate_uncorrected": 0,
}

MODELS: dict[str, dict[str, Any]] = {
    "H100-SXM": {
        **_COMMON,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_device_id": 0x233010DE,
        "memory_gib": 79.6474609375,  # 81559 MiB, as reported
        "bar1_gib": 128,
        "architecture": "hopper",
        "compute_capability": "9.0",
        "power_limit_w": 700,
        "default_power_limit_w": 700,
        "min_power_limit_w": 200,
        "max_power_limit_w": 700,
        "idle_power_w": 70,
        "max_power_w": 690,
        "sm_clock_mhz": 1980,
        "sm_clock_idle_mhz": 345,
        "mem_clock_mhz": 2619,
        "video_clock_mhz": 1545,
        "ecc": True,
        "fans": 0,
        "nvlink_links": 18,
        "pcie_gen": 5,
        "pcie_width": 16,
        "thermal_c_per_w": 0.07,
        "slowdown_temp_c": 87,
        "shutdown_temp_c": 92,
        "mem_temp_offset_c": 6,
        "pcie_tx_mb_s": 2000,
        "pcie_rx_mb_s": 6000,
        "nvlink_tx_mb_s": 120000,
        "nvlink_rx_mb_s": 120000,
        "mig_capable": True,
    },
    "A100-SXM": {
        **_COMMON,
        "name": "NVIDIA A100-SXM4-80GB",
        "pci_device_id": 0x20B210DE,
        "memory_gib": 80,
        "bar1_gib": 128,
        "architecture": "ampere",
        "compute_capability": "8.0",
        "power_limit_w": 400,
        "default_power_limit_w": 400,
        "min_power_limit_w": 100,
        "max_power_limit_w": 400,
        "idle_power_w": 55,
        "max_power_w": 395,
        "sm_clock_mhz": 1410,
        "sm_clock_idle_mhz": 210,
        "mem_clock_mhz": 1593,
        "video_clock_mhz": 1275,
        "ecc": True,
        "fans": 0,
        "nvlink_links": 12,
        "pcie_gen": 4,
        "pcie_width": 16,
        "thermal_c_per_w": 0.11,
        "slowdown_temp_c": 89,
        "shutdown_temp_c": 92,
        "mem_temp_offset_c": 5,
        "pcie_tx_mb_s": 1500,
        "pcie_rx_mb_s": 4000,
        "nvlink_tx_mb_s": 60000,
        "nvlink_rx_mb_s": 60000,
        "mig_capable": True,
    },
    "L4": {
        **_COMMON,
        "name": "NVIDIA L4",
        "pci_device_id": 0x27B810DE,
        "memory_gib": 22.49609375,  # 23034 MiB
        "bar1_gib": 32,
        "architecture": "ada",
        "compute_capability": "8.9",
        "power_limit_w": 72,
        "default_power_limit_w": 72,
        "min_power_limit_w": 40,
        "max_power_limit_w": 72,
        "idle_power_w": 16,
        "max_power_w": 72,
        "sm_clock_mhz": 2040,
        "sm_clock_idle_mhz": 210,
        "mem_clock_mhz": 6251,
        "video_clock_mhz": 1770,
        "ecc": True,
        "fans": 0,
        "nvlink_links": 0,
        "pcie_gen": 4,
        "pcie_width": 16,
        "thermal_c_per_w": 0.6,
        "slowdown_temp_c": 85,
        "shutdown_temp_c": 90,
        "mem_temp_offset_c": 0,
        "pcie_tx_mb_s": 800,
        "pcie_rx_mb_s": 2500,
        "nvlink_tx_mb_s": 0,
        "nvlink_rx_mb_s": 0,
        "mig_capable": False,
    },
    "RTX-4090": {
        **_COMMON,
        "name": "NVIDIA GeForce RTX 4090",
        "pci_device_id": 0x268410DE,
        "memory_gib": 23.98828125,  # 24564 MiB
        "bar1_gib": 32,
        "architecture": "ada",
        "compute_capability": "8.9",
        "power_limit_w": 450,
        "default_power_limit_w": 450,
        "min_power_limit_w": 150,
        "max_power_limit_w": 600,
        "idle_power_w": 25,
        "max_power_w": 440,
        "sm_clock_mhz": 2520,
        "sm_clock_idle_mhz": 210,
        "mem_clock_mhz": 10501,
        "video_clock_mhz": 1965,
        "ecc": False,  # GeForce: ECC queries are NOT_SUPPORTED
        "fans": 2,
        "nvlink_links": 0,
        "pcie_gen": 4,
        "pcie_width": 16,
        "thermal_c_per_w": 0.11,
        "slowdown_temp_c": 88,
        "shutdown_temp_c": 93,
        "mem_temp_offset_c": 0,
        "pcie_tx_mb_s": 1000,
        "pcie_rx_mb_s": 3000,
        "nvlink_tx_mb_s": 0,
        "nvlink_rx_mb_s": 0,
        "mig_capable": False,
    },
}

#: Aliases accepted for ``model``.
ALIASES: dict[str, str] = {
    "H100": "H100-SXM",
    "A100": "A100-SXM",
    "RTX4090": "RTX-4090",
}

#: PCI bus numbers of an 8-GPU HGX board, used for the default bus ids.
HGX_BUSES: tuple[int, ...] = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def model_names() -> list[str]:
    """Names accepted for ``model`` (aliases included), sorted."""
    return sorted([*MODELS, *ALIASES])


def model_defaults(name: str) -> dict[str, Any] | None:
    """A copy of the model's device keys, or ``None`` for an unknown model."""
    real = ALIASES.get(name, name)
    model = MODELS.get(real)
    return None if model is None else {**model, "unsupported": list(model["unsupported"])}
