"""``python -m trainer ...``: see trainer/cli.py."""

import sys

from trainer import distributed
from trainer.cli import main

sys.exit(distributed.finish(main()))  # a gloo thread must not live on into finalization
