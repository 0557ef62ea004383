"""The sandbox hosts' stand-in for Google's guest agent (accounts and SSH keys from metadata).

`agent.py` runs inside each backend-created host (stdlib only, Python 3.10); th-up.sh installs it
with `forja-guest-agent.service` when TH_GUEST_AGENT names this folder.
"""

from pathlib import Path

#: The folder th-up.sh copies the agent and its unit from.
FOLDER = Path(__file__).parent
