"""The simulator's feature bits: the Python scenario table and the C library agree.

``otelgpu.sim.scenario.FEATURES`` turns a scenario's ``unsupported = [...]`` into the
bitmask the C library tests (``FEAT_*`` in ``src_ext/sim/sim.h``); the library exports
its own table (``otelgpu_sim_features``), so the two are compared module to module.
"""

from __future__ import annotations

from otelgpu.sim import _library
from otelgpu.sim.scenario import FEATURES


def test_sim_feature_bits_match_the_c_library() -> None:
    lib = _library.load()
    text = lib.otelgpu_sim_features().decode()
    exported = {name: int(bit) for name, bit in (item.split("=") for item in text.split(","))}
    assert exported == FEATURES
