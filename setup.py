# Only job: build the cffi extension (see c_ext/build.py). Metadata is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["c_ext/build.py:ffibuilder"])
