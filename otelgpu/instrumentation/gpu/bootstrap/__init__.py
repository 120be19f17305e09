"""Start-up hook directory for ``otelgpu run``: holds ``sitecustomize.py`` (a package only
so that it ships in wheels; the directory itself goes on ``PYTHONPATH``)."""
