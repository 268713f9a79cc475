# Only job: build the C extensions - the cffi one (see c_ext/build.py), the
# recorder of partial-order reduction (c_ext/track.c, CPython's C API: it must be
# a type's attribute slots) and the tracer's event recorder (c_ext/tracebuf.c, a
# type whose methods the trampolines call). Metadata is in pyproject.toml.
from setuptools import Extension, setup

setup(cffi_modules=["c_ext/build.py:ffibuilder"],
      ext_modules=[Extension("c_ext._track", ["c_ext/track.c"], extra_compile_args=["-O2"]),
                   Extension("c_ext._tracebuf", ["c_ext/tracebuf.c"],
                             extra_compile_args=["-O2"])])
