"""`python -m bench`: the speed benchmark."""

import sys

from bench.speed import main

sys.exit(main())
