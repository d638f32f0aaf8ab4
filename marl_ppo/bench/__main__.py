"""`python -m marl_ppo.bench`: the speed benchmark."""

import sys

from marl_ppo.bench.speed import main

sys.exit(main())
