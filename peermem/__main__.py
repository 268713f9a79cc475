"""`python -m peermem ...` is the `peermem` command."""

import sys

from peermem.cli import main

sys.exit(main())
