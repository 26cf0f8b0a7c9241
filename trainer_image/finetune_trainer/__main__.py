"""`python -m finetune_trainer --config PATH`: the container's command."""

import sys

from .launch.entry import main

sys.exit(main())
