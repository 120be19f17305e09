"""The collaborators behind the :class:`otelgpu._runtime.Runtime` façade.

* :mod:`.records` -- ``StepRecord`` / ``RequestRecord``: one finished step or request;
* :mod:`.gpu` -- ``GpuContext``: GPU window attributes and health events of a time span;
* :mod:`.health` -- ``HealthMonitor``: GPU health events logged once and counted;
* :mod:`.steps` -- ``StepRecorder``: step spans and metrics;
* :mod:`.requests` -- ``RequestRecorder``: request spans and metrics;
* :mod:`.api` -- ``RuntimeAPI``: the protocol the torch and vLLM instrumentors type against.
"""
