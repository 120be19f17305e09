"""GPU truth per unit of work: MFU per step, energy per step, sample, token and request.

* :mod:`~otelgpu.gpu_truth.peaks` -- peak FLOP/s per GPU model and dtype (documented table).
* :mod:`~otelgpu.gpu_truth.flops` -- model FLOPs of a step from torch's FLOP counter.
* :mod:`~otelgpu.gpu_truth.work` -- the span attributes and sketches the step and request
  recorders add (MFU, its disagreement with GPM tensor activity, joules per unit of work).
"""
