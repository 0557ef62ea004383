"""The local sandbox cloud: real local hosts (systemd-nspawn) and a Compute API emulator."""
