"""`python -m dispatcher.cli`: the `dispatcher` command."""

import sys

from dispatcher.cli import main

sys.exit(main())
