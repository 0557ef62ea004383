"""``python -m trainer ...``: see trainer/cli.py."""

import sys

from trainer import distributed
from trainer.cli import main

code = main()
if distributed.joined_a_group():  # a gloo thread must not outlive into finalization
    distributed.exit_process(code)
sys.exit(code)
