"""A tiny training task the Vertex emulator's tests submit as a pythonPackageSpec (a local folder)."""
