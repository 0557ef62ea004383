"""`forja ui`: a small local web dashboard of the runs, their live metrics, their cost and the VM.

The server is `forja.ui.server` (Starlette on uvicorn, 127.0.0.1 only, a token as Jupyter has one);
the page and its vendored chart library are files under `static/` (no internet needed to show it).
"""
