"""Print {"torch": version or null, "fits": bool} for this interpreter's PyTorch and a PEP 440 spec.

Run by the trainer_run role with the candidate interpreter (e.g. the Deep Learning VM's conda
Python) so an image that already ships a fitting PyTorch is reused instead of downloading 3+ GB.
Never fails: a missing torch or packaging simply means "does not fit". The JSON is the last line
of output (the role reads only that line).
"""

import json
import sys
import warnings


def main() -> None:
    spec = sys.argv[1] if len(sys.argv) > 1 else ""
    warnings.simplefilter("ignore")  # torch warns on stderr, which a remote tty mixes into stdout
    try:
        import torch

        version = torch.__version__.split("+")[0]
    except Exception:  # any import failure means there is no usable torch
        print(json.dumps({"torch": None, "fits": False}))
        return
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        try:
            from pip._vendor.packaging.specifiers import SpecifierSet
        except ImportError:
            print(json.dumps({"torch": version, "fits": False, "why": "no packaging module"}))
            return
    print(json.dumps({"torch": version, "fits": version in SpecifierSet(spec)}))


main()
