"""`python -m hack.cluster up|down|status`: the local control plane (see the package docstring)."""

import argparse
import sys

from . import lifecycle
from .layout import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    if args.command == "up":
        return lifecycle.up()
    if args.command == "down":
        return lifecycle.down()
    layout = Layout.for_repo()
    if lifecycle.running(layout):
        print(f"running; KUBECONFIG={layout.kubeconfig}")
        return 0
    print("not running")
    return 1


if __name__ == "__main__":
    sys.exit(main())
