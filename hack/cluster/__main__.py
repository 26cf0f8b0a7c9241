"""`python -m hack.cluster up|down|status|kueue-up|kueue-down`: the local control plane (see the package
docstring); Kueue is optional and runs on a cluster that is up."""

import argparse
import sys

from . import lifecycle
from .layout import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status", "kueue-up", "kueue-down"))
    args = parser.parse_args(argv)
    if args.command == "up":
        return lifecycle.up()
    if args.command == "down":
        return lifecycle.down()
    if args.command == "kueue-up":
        return lifecycle.kueue_up()
    if args.command == "kueue-down":
        return lifecycle.kueue_down()
    layout = Layout.for_repo()
    if lifecycle.running(layout):
        print(f"running; KUBECONFIG={layout.kubeconfig}")
        return 0
    print("not running")
    return 1


if __name__ == "__main__":
    sys.exit(main())
