"""otelgpu's OpenTelemetry pipeline: providers, exporters, local recording, resource and
the export of quantile sketches as OTLP exponential histograms.

Only public OpenTelemetry SDK APIs are used. Modules:

* ``stats``      -- internal error and drop counters (``otelgpu.internal.*``);
* ``sketches``   -- ``SketchHistogram``: per-attribute-set sketches, exported losslessly;
* ``processor``  -- a bounded, fork-aware batch span processor that counts what it drops;
* ``exporters``  -- exporter construction and the guarding wrappers around them;
* ``recording``  -- the OTLP JSON-lines recording file (the collector's file-exporter format);
* ``resource``   -- service, host, process, GPU, rank, SLURM and Kubernetes attributes;
* ``providers``  -- attach to the application's providers or build otelgpu's own.
"""
