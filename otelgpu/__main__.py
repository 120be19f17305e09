"""``python -m otelgpu`` is the ``otelgpu`` command."""

from otelgpu.cli import main

raise SystemExit(main())
