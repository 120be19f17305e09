"""Single source of the package version (read by setuptools' dynamic metadata)."""

__version__ = "0.1.0"
