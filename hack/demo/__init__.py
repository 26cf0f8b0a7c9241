"""Helpers of `make demo` (hack/demo.sh): the loss-curve plot."""
