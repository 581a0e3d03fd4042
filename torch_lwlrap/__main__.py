"""``python -m torch_lwlrap``: the command line of :mod:`torch_lwlrap.cli`."""

from torch_lwlrap.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
