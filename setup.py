# Only job: build the C extensions - the cffi one (see c_ext/build.py) and the
# recorder of partial-order reduction (c_ext/track.c, CPython's C API: it must be
# a type's attribute slots). Metadata is in pyproject.toml.
from setuptools import Extension, setup

setup(cffi_modules=["c_ext/build.py:ffibuilder"],
      ext_modules=[Extension("c_ext._track", ["c_ext/track.c"], extra_compile_args=["-O2"])])
