"""`python -m finetune_trainer --config PATH`: the container's command."""

import sys

from .entry import main

sys.exit(main())
