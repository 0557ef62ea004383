"""forja: reproducible, safe and cheap GPU training hosts driven by Ansible."""

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
