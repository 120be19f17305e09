"""The live view: a read-only snapshot socket in the instrumented process, and ``otelgpu top``.

See ``docs/live-view.md`` for the protocol: :mod:`.protocol` (paths, permission checks,
one JSON document per connection), :mod:`.provider` (the runtime side, started by
``instrument()`` when the ``live`` setting is on), :mod:`.view` (the terminal view).
"""
