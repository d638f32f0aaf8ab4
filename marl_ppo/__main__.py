"""`python -m marl_ppo` runs the command line."""

import sys

from marl_ppo.cli import main

sys.exit(main())
