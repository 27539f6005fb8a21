"""``python -m nemo_gym_env.cli``: the same as ``nemo-gym-env``."""

import sys

from nemo_gym_env.cli.main import main

sys.exit(main())
