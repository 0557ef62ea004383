"""`forja ui`: a small local web dashboard of the runs, their live metrics, their cost and the VM.

The server is `forja.ui.server` (Starlette on uvicorn, 127.0.0.1 only, a token as Jupyter has one);
the page and its vendored chart library are files under `static/` (no internet needed to show it).
"""

#: The dashboard's default port (Jupyter's 8888 and the runs' metrics ports 8890-8899 stay free). Here,
#: not in the server, so the API and the CLI name it without loading Starlette and uvicorn.
DEFAULT_PORT = 8877
