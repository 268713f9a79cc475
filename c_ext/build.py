"""cffi build script for c_ext._pm (out-of-line API mode).

setup.py names this file in cffi_modules, so `pip install .` compiles pm.c on
the user's machine.  The C declarations are read from the private header so
they are written once.
"""

import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).parent
HEADER = (HERE / "pm.h").read_text()

ffibuilder = FFI()
# cdef takes no preprocessor lines and no comments: keep structs and prototypes.
_cdef = re.sub(r"/\*.*?\*/", "", HEADER, flags=re.S)
_cdef = "\n".join(line for line in _cdef.splitlines() if not line.startswith("#"))
ffibuilder.cdef(_cdef)
ffibuilder.set_source(
    "c_ext._pm",
    '#include "pm.h"',
    sources=["c_ext/pm.c"],  # relative: setuptools refuses absolute paths
    include_dirs=["c_ext"],
    extra_compile_args=["-O2", "-std=c99"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
