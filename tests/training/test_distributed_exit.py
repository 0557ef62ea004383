"""A process that joined a process group ends through `distributed.exit_process`, not finalization.

Why it exists is in its docstring (a gloo thread alive into finalization aborts a completed run).
What is proven here is that skipping finalization loses nothing a trainer or a user's script
counts on: the exit code, buffered output, atexit handlers, and non-daemon threads' work.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainer_helpers import subprocess_env

SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
from trainer import distributed

out = Path(sys.argv[1])
atexit.register(lambda: out.with_suffix(".atexit").write_text("ran"))
def late() -> None:
    time.sleep(0.5)
    out.with_suffix(".thread").write_text("done")
threading.Thread(target=late).start()
sys.stdout.write("no newline, still buffered")
distributed.exit_process(3)
"""


def test_exit_process_keeps_the_code_the_output_the_atexit_handlers_and_thread_work(tmp_path: Path) -> None:
    out = tmp_path / "mark"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], env=subprocess_env(),
                          stdout=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 3
    assert done.stdout == "no newline, still buffered"
    assert out.with_suffix(".atexit").read_text() == "ran"
    assert out.with_suffix(".thread").read_text() == "done"
