"""`python -m hack.cluster up|down|status|kueue-up|kueue-down|binaries`: the local control plane (see
the package docstring); Kueue is optional and runs on a cluster that is up. `binaries` builds
every binary where the versioned cache lacks it, the optional ones too (Kueue, promtool), and
starts nothing: `make test` runs it before the tests, so no test waits on a build."""

import argparse
import sys

from . import binaries, lifecycle
from .layout import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status", "kueue-up", "kueue-down", "binaries"))
    args = parser.parse_args(argv)
    if args.command == "binaries":
        return binaries.ensure_all(Layout.for_repo())
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
