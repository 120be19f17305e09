"""Builds otelgpu's native parts; all metadata lives in pyproject.toml.

* Cython extensions (the native twins of the sketch, the sampler, the OTLP encoders and
  the torch step tracker);
* the simulated NVML library, a plain C shared library installed as
  ``otelgpu/sim/lib/libnvidia-ml.so.1`` (soname ``libnvidia-ml.so.1``).

Every native part is optional: if the compiler or Cython fails on one of them the
failure is reported and the package still installs, falling back to the pure-Python
twins (``otelgpu.NATIVE`` then says so). ``OTELGPU_NO_EXTENSIONS=1`` at build time
skips the Cython extensions altogether.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent


def _load_flags():  # type: ignore[no-untyped-def]
    """otelgpu/_flags.py by path: the same flag parser as the runtime's otelgpu._impl."""
    spec = importlib.util.spec_from_file_location("_otelgpu_flags", ROOT / "otelgpu" / "_flags.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_flags = _load_flags()
NO_EXTENSIONS = _flags.env_flag("OTELGPU_NO_EXTENSIONS")
DEBUG = _flags.env_flag("OTELGPU_DEBUG")
OPT = ["-O0", "-g"] if DEBUG else ["-O3"]

# Plain C shared libraries (no Python module init): name -> path inside the package.
C_LIBRARIES = {"otelgpu.sim.lib._nvml_sim": "otelgpu/sim/lib/libnvidia-ml.so.1"}


def cython_extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        return []
    from Cython.Build import cythonize

    exts = []
    for pyx, name in [
        ("src_ext/sketch/_sketch_c.pyx", "otelgpu.sketch._sketch_c"),
        ("src_ext/sampler/_sampler_c.pyx", "otelgpu.sampler._sampler_c"),
        ("src_ext/otel/_otlp_c.pyx", "otelgpu.otel._otlp_c"),
        ("src_ext/torch/_steps_c.pyx", "otelgpu.instrumentation.torch._steps_c"),
    ]:
        if (ROOT / pyx).exists():
            exts.append(
                Extension(
                    name,
                    [pyx],
                    include_dirs=["src_ext", str(Path(pyx).parent)],
                    extra_compile_args=[*OPT, "-std=c11", "-Wno-unused-function"],
                    libraries=["dl"],
                    define_macros=[("OTELGPU_DEBUG", "1" if DEBUG else "0")],
                )
            )
    built: list[Extension] = []
    for ext in exts:  # one at a time, so a Cython error in one leaves the others
        try:
            built += cythonize(
                [ext],
                include_path=["src_ext"],
                language_level=3,
                compiler_directives={"embedsignature": True},
                quiet=True,
            )
        except Exception as exc:
            print(f"WARNING: otelgpu could not cythonize {ext.name} ({exc})", file=sys.stderr)
    return built


def c_libraries() -> list[Extension]:
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src_ext/sim").glob("*.c"))
    if not sources:
        return []
    return [
        Extension(
            "otelgpu.sim.lib._nvml_sim",
            sources,
            include_dirs=["src_ext/sim", "src_ext"],
            extra_compile_args=[*OPT, "-std=gnu11", "-fvisibility=hidden", "-pthread"],
            extra_link_args=["-Wl,-soname,libnvidia-ml.so.1", "-pthread", "-lm"],
        )
    ]


class OptionalBuildExt(build_ext):
    """build_ext where each extension may fail without failing the install."""

    def get_ext_filename(self, fullname: str) -> str:
        # distutils asks with the last name component (the build path), setuptools'
        # in-place copy with the full name: answer both for the plain C libraries.
        for name, path in C_LIBRARIES.items():
            if fullname == name:
                return path
            if fullname == name.rpartition(".")[2]:
                return os.path.basename(path)
        return str(super().get_ext_filename(fullname))

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if ext.name in C_LIBRARIES:
            return []  # not a Python module: no PyInit_ symbol
        return list(super().get_export_symbols(ext))

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # compiler missing, Cython error, link error...
            print(
                f"WARNING: otelgpu could not build {ext.name} ({exc}); "
                "the pure-Python twin will be used",
                file=sys.stderr,
            )

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # e.g. no C compiler at all
            print(f"WARNING: otelgpu native build skipped ({exc})", file=sys.stderr)


setup(ext_modules=[*cython_extensions(), *c_libraries()], cmdclass={"build_ext": OptionalBuildExt})
