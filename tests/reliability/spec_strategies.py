"""Hypothesis strategies for FineTuneJob specs: valid ones near every bound, and broken ones.

Each generated `SpecCase` says what a correct validator must answer: `valid`, `invalid` (and
which field a problem line must name), or `either` (the spec is legal for the API models but
may be refused further down, e.g. a nodeSelector value the Job API rejects). Broken specs are
built by mutating a valid one in exactly one place, so the expected field is known.
"""

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from finetune_api.base import DNS_SUBDOMAIN_PATTERN, LABEL_VALUE_PATTERN

Expect = Literal["valid", "invalid", "either"]


@dataclass(frozen=True)
class SpecCase:
    spec: Any
    expect: Expect
    # A dotted camelCase path (or a word) the problem line must contain when `expect` is invalid.
    field: str | None
    what: str


# --- building blocks -------------------------------------------------------------------------

DNS_NAME = st.from_regex(DNS_SUBDOMAIN_PATTERN, fullmatch=True).filter(lambda s: 1 <= len(s) <= 253)
SHORT_DNS_NAME = st.from_regex(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$", fullmatch=True)
LABEL_VALUE = st.from_regex(LABEL_VALUE_PATTERN, fullmatch=True).filter(lambda s: 1 <= len(s) <= 63)
REL_PATH = st.lists(
    st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s and s not in (".", "..")), max_size=4
).map("/".join)
HUB_ID = st.from_regex(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,40}(/[-A-Za-z0-9_.]{1,40})?$", fullmatch=True)
# Sizes, CPU and memory must be greater than zero (a zero-size PVC is refused by the API server).
QUANTITY = st.one_of(
    st.integers(1, 10**6),
    st.from_regex(r"^[0-9]{1,6}(\.[0-9]{1,3})?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$", fullmatch=True).filter(
        lambda q: float(q.rstrip("mkKMGTi")) > 0
    ),
)
PRODUCTS = ("Tesla-P40", "Tesla-P100-PCIE-16GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Quadro-P6000")


@dataclass(frozen=True)
class Bound:
    """One numeric field and its legal range (as spec.py declares it)."""

    path: tuple[str, ...]
    integer: bool
    low: float
    high: float | None
    low_open: bool = False
    high_open: bool = False


BOUNDS = (
    Bound(("lora", "r"), True, 1, 256),
    Bound(("lora", "alpha"), True, 1, 4096),
    Bound(("lora", "dropout"), False, 0, 1),
    Bound(("training", "epochs"), False, 0, 1000, low_open=True),
    Bound(("training", "maxSteps"), True, 1, 10_000_000),
    Bound(("training", "learningRate"), False, 0, 1, low_open=True),
    Bound(("training", "warmupRatio"), False, 0, 1, high_open=True),
    Bound(("training", "batchSize"), True, 1, 1024),
    Bound(("training", "gradientAccumulation"), True, 1, 1024),
    Bound(("training", "maxLength"), True, 16, 131072),
    Bound(("training", "weightDecay"), False, 0, 1),
    Bound(("training", "maxGradNorm"), False, 0, 1000, low_open=True),
    Bound(("training", "loggingSteps"), True, 1, 100_000),
    Bound(("training", "seed"), True, 0, 2**31 - 1),
    Bound(("checkpoints", "everySteps"), True, 1, 10_000_000),
    Bound(("checkpoints", "keep"), True, 2, 100),
    Bound(("resources", "gpus"), True, 0, 64),
    Bound(("backoffLimit",), True, 0, 100),
    Bound(("activeDeadlineSeconds",), True, 1, None),
    Bound(("ttlSecondsAfterFinished",), True, 0, None),
    Bound(("dataset", "evalFraction"), False, 0, 0.5, low_open=True),
)

ENUMS = {
    ("dataset", "format"): ("alpaca", "sharegpt", "messages", "text", "completion"),
    ("quantization", "type"): ("nf4", "fp4", "none"),
    ("precision",): ("auto", "fp32", "bf16", "fp16"),
    ("training", "lrScheduler"): (
        "cosine",
        "linear",
        "constant",
        "constant_with_warmup",
        "cosine_with_min_lr",
        "polynomial",
    ),
    ("training", "optimizer"): (
        "paged_adamw_8bit",
        "paged_adamw_32bit",
        "adamw_8bit",
        "adamw_torch",
        "adafactor",
        "sgd",
    ),
}

# String fields with a length limit: (path, limit).
LENGTH_LIMITS = (
    (("model", "source", "hub", "revision"), 256),
    (("image",), 253),
    (("output", "pvc", "path"), 1024),
    (("placement", "queueName"), 63),
    (("resources", "gpuProduct"), 63),
)


def in_bounds(bound: Bound) -> st.SearchStrategy[float]:
    """Values inside the range, with its edges (or the nearest legal float) drawn often."""
    high = bound.high if bound.high is not None else (2**31 - 1 if bound.integer else 1e9)
    if bound.integer:
        edges = [int(bound.low), int(high)]
        return st.one_of(st.sampled_from(edges), st.integers(int(bound.low), int(high)))
    low = math.nextafter(bound.low, math.inf) if bound.low_open else bound.low
    top = math.nextafter(high, -math.inf) if bound.high_open else high
    return st.one_of(st.sampled_from([low, top]), st.floats(low, top, allow_nan=False))


def out_of_bounds(bound: Bound) -> st.SearchStrategy[float]:
    """Values just outside the range (and far outside), plus NaN/inf for floats."""
    options: list[float] = []
    if bound.integer:
        options += [int(bound.low) - 1, -(2**63), -1]
        if bound.high is not None:
            options += [int(bound.high) + 1, 2**63]
        return st.sampled_from([o for o in options if o < bound.low or (bound.high is not None and o > bound.high)])
    options += [bound.low if bound.low_open else math.nextafter(bound.low, -math.inf), -1e308, math.nan]
    if bound.high is not None:
        options += [bound.high if bound.high_open else math.nextafter(bound.high, math.inf), math.inf]
    return st.sampled_from(options)


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(("spec", *path))


# --- valid specs -------------------------------------------------------------------------------


@st.composite
def sources(draw: st.DrawFn, dataset: bool) -> dict[str, Any]:
    if draw(st.booleans()):
        pvc: dict[str, Any] = {"claimName": draw(DNS_NAME)}
        if draw(st.booleans()):
            pvc["path"] = draw(REL_PATH)
        return {"pvc": pvc}
    hub: dict[str, Any] = {"id": draw(HUB_ID)}
    if draw(st.booleans()):
        hub["revision"] = draw(st.text(min_size=1, max_size=256))
    if draw(st.booleans()):
        hub["tokenSecret"] = draw(SHORT_DNS_NAME)
    if dataset and draw(st.booleans()):
        hub["split"] = draw(st.text(min_size=1, max_size=128))
    return {"hub": hub}


@st.composite
def optional_numbers(draw: st.DrawFn, section: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for bound in BOUNDS:
        if len(bound.path) == 2 and bound.path[0] == section and draw(st.booleans()):
            out[bound.path[1]] = draw(in_bounds(bound))
    return out


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": draw(sources(dataset=False))},
        "dataset": {
            "source": draw(sources(dataset=True)),
            "format": draw(st.sampled_from(ENUMS[("dataset", "format")])),
        },
    }
    if draw(st.booleans()):
        spec["dataset"]["evalFraction"] = draw(in_bounds(BOUNDS[-1]))
    if draw(st.booleans()):
        spec["output"] = {"pvc": {"claimName": draw(DNS_NAME), "path": draw(REL_PATH)}}
    else:
        storage: dict[str, Any] = {"size": draw(QUANTITY)}
        if draw(st.booleans()):
            storage["storageClassName"] = draw(SHORT_DNS_NAME)
        storage["deleteWithJob"] = draw(st.booleans())
        spec["output"] = {"storage": storage}
    spec["output"]["merge"] = draw(st.booleans())

    lora = draw(optional_numbers("lora"))
    if draw(st.booleans()):
        lora["targetModules"] = draw(st.lists(st.text(min_size=1, max_size=128), min_size=1, max_size=64))
    if lora:
        spec["lora"] = lora
    training = draw(optional_numbers("training"))
    if "epochs" in training and "maxSteps" in training:
        del training[draw(st.sampled_from(["epochs", "maxSteps"]))]
    for key in ("lrScheduler", "optimizer"):
        if draw(st.booleans()):
            training[key] = draw(st.sampled_from(ENUMS[("training", key)]))
    for key in ("packing", "gradientCheckpointing"):
        if draw(st.booleans()):
            training[key] = draw(st.booleans())
    method = draw(st.sampled_from(("sft", "dpo", "orpo")))
    if method != "sft":  # a preference method: its format, no packing, its own block or none
        training["method"] = method
        spec["dataset"]["format"] = "preference"
        if training.get("packing"):
            del training["packing"]
        if draw(st.booleans()):
            training[method] = {"beta": draw(st.floats(min_value=1e-3, max_value=100))}
            if method == "dpo" and draw(st.booleans()):
                training[method]["lossType"] = draw(st.sampled_from(("sigmoid", "ipo")))
    if training:
        spec["training"] = training
    checkpoints = draw(optional_numbers("checkpoints"))
    if checkpoints:
        spec["checkpoints"] = checkpoints
    if draw(st.booleans()):
        spec["quantization"] = {
            "type": draw(st.sampled_from(ENUMS[("quantization", "type")])),
            "doubleQuant": draw(st.booleans()),
        }

    resources: dict[str, Any] = draw(optional_numbers("resources"))
    product = draw(st.one_of(st.sampled_from(PRODUCTS), LABEL_VALUE))
    resources["gpuProduct"] = product
    for key in ("cpu", "memory"):
        if draw(st.booleans()):
            resources[key] = draw(QUANTITY)
    spec["resources"] = resources
    from finetune_api.gpus import is_pascal

    precisions = ("auto", "fp32") if is_pascal(product) else ENUMS[("precision",)]
    spec["precision"] = draw(st.sampled_from(precisions))

    placement: dict[str, Any] = {}
    if draw(st.booleans()):
        placement["nodeSelector"] = draw(st.dictionaries(SHORT_DNS_NAME, LABEL_VALUE, max_size=4))
    if draw(st.booleans()):
        placement["tolerations"] = [
            {
                "key": draw(SHORT_DNS_NAME),
                "operator": "Exists",
                "effect": draw(st.sampled_from(["NoSchedule", "NoExecute"])),
            }
        ]
    if draw(st.booleans()):
        placement["priorityClassName"] = draw(SHORT_DNS_NAME)
    if draw(st.booleans()):
        placement["queueName"] = draw(SHORT_DNS_NAME)
    if placement:
        spec["placement"] = placement
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if draw(st.booleans()):
            bound = next(b for b in BOUNDS if b.path == (key,))
            spec[key] = draw(in_bounds(bound))
    if draw(st.booleans()):
        spec["suspend"] = draw(st.booleans())
    if draw(st.booleans()):
        spec["image"] = draw(st.text(min_size=1, max_size=253))
    return spec


# --- broken specs: one mutation each ---------------------------------------------------------

WRONG_TYPES = st.one_of(
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.text(min_size=1, max_size=20).filter(lambda s: not _numeric(s) and s.strip().lower() not in _BOOL_WORDS),
)
_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0", "t", "f", "y", "n"}


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@st.composite
def mutated_specs(draw: st.DrawFn) -> SpecCase:
    spec = draw(valid_specs())
    kind = draw(
        st.sampled_from(
            [
                "out-of-bounds",
                "wrong-type",
                "unknown-field",
                "bad-enum",
                "two-sources",
                "no-source",
                "two-outputs",
                "two-lengths",
                "pascal-half",
                "too-long",
                "bad-name",
                "bad-quantity",
                "missing-required",
                "too-many",
                "not-a-mapping",
                "unicode-name",
            ]
        )
    )
    if kind == "out-of-bounds":
        bound = draw(st.sampled_from(BOUNDS))
        if bound.path == ("training", "epochs"):
            spec.get("training", {}).pop("maxSteps", None)
        if bound.path == ("training", "maxSteps"):
            spec.get("training", {}).pop("epochs", None)
        value = draw(out_of_bounds(bound))
        _set(spec, bound.path, value)
        return SpecCase(spec, "invalid", dotted(bound.path), f"{dotted(bound.path)} = {value!r}")
    if kind == "wrong-type":
        bound = draw(st.sampled_from(BOUNDS))
        value = draw(WRONG_TYPES)
        _set(spec, bound.path, value)
        return SpecCase(spec, "invalid", dotted(bound.path), f"{dotted(bound.path)} has type {type(value).__name__}")
    if kind == "unknown-field":
        parents = [(), ("training",), ("lora",), ("resources",), ("model", "source"), ("output",)]
        parent = draw(st.sampled_from(parents))
        node = _get(spec, parent) if parent else spec
        known = set(node) if isinstance(node, dict) else set()
        key = draw(st.text(min_size=1, max_size=40).filter(lambda k: k not in known and k not in _KNOWN_ANYWHERE))
        if parent:
            _set(spec, (*parent, key), draw(st.integers()))
        else:
            spec[key] = draw(st.integers())
        return SpecCase(spec, "invalid", dotted(parent), f"unknown field {key!r} under {dotted(parent)}")
    if kind == "bad-enum":
        path = draw(st.sampled_from(list(ENUMS)))
        value = draw(st.text(max_size=30).filter(lambda v: v not in ENUMS[path]))
        _set(spec, path, value)
        return SpecCase(spec, "invalid", dotted(path), f"{dotted(path)} = {value!r}")
    if kind == "two-sources":
        which = draw(st.sampled_from(["model", "dataset"]))
        spec[which]["source"] = {"pvc": {"claimName": "a"}, "hub": {"id": "org/model"}}
        return SpecCase(spec, "invalid", f"spec.{which}.source", f"{which} with pvc and hub")
    if kind == "no-source":
        which = draw(st.sampled_from(["model", "dataset"]))
        spec[which]["source"] = {}
        return SpecCase(spec, "invalid", f"spec.{which}.source", f"{which} with no source")
    if kind == "two-outputs":
        spec["output"] = {"pvc": {"claimName": "out"}, "storage": {"size": "1Gi"}}
        return SpecCase(spec, "invalid", "spec.output", "output with pvc and storage")
    if kind == "two-lengths":
        spec.setdefault("training", {}).update(epochs=1.0, maxSteps=10)
        return SpecCase(spec, "invalid", "spec.training", "epochs and maxSteps")
    if kind == "pascal-half":
        spec.setdefault("resources", {})["gpuProduct"] = draw(
            st.sampled_from(["Tesla-P40", "Quadro-P6000", "GTX-1080"])
        )
        spec["precision"] = draw(st.sampled_from(["bf16", "fp16"]))
        return SpecCase(spec, "invalid", "precision", "half precision on Pascal")
    if kind == "too-long":
        path, limit = draw(st.sampled_from(LENGTH_LIMITS))
        if path[:3] == ("model", "source", "hub"):
            spec["model"]["source"] = {"hub": {"id": "org/model"}}
        if path[:2] == ("output", "pvc"):
            spec["output"] = {"pvc": {"claimName": "out"}}
        size = draw(st.sampled_from([limit + 1, limit * 4, 100_000]))
        filler = draw(st.sampled_from(["a", "é", "字", "0"]))
        _set(spec, path, filler * size)
        return SpecCase(spec, "invalid", dotted(path), f"{dotted(path)} of {size} characters")
    if kind == "bad-name":
        name = draw(st.sampled_from(["Upper", "-lead", "trail-", "a_b", "a" * 254, "", "white space"]))
        spec["output"] = {"pvc": {"claimName": name}}
        return SpecCase(spec, "invalid", "spec.output.pvc.claimName", f"claimName {name[:20]!r}")
    if kind == "unicode-name":
        name = draw(st.text(min_size=1, max_size=30).filter(lambda s: any(ord(c) > 127 for c in s)))
        spec["model"]["source"] = {"pvc": {"claimName": name}}
        return SpecCase(spec, "invalid", "spec.model.source.pvc.claimName", f"claimName {name!r}")
    if kind == "dotdot-path":
        # The API promises a path can never leave its claim.
        path = draw(st.sampled_from(["..", "../x", "a/../../etc", "a/..", "./.."]))
        which = draw(st.sampled_from(["model", "dataset", "output"]))
        if which == "output":
            spec["output"] = {"pvc": {"claimName": "out", "path": path}}
            return SpecCase(spec, "invalid", "spec.output.pvc.path", f"output path {path!r}")
        spec[which]["source"] = {"pvc": {"claimName": "src", "path": path}}
        return SpecCase(spec, "invalid", f"spec.{which}.source.pvc.path", f"{which} path {path!r}")
    if kind == "bad-quantity":
        key = draw(st.sampled_from(["cpu", "memory"]))
        value = draw(st.sampled_from(["abc", "1.5.5", "-1", "10 Gi", "1e3x", "0x10", "∞"]))
        spec.setdefault("resources", {})[key] = value
        return SpecCase(spec, "invalid", f"spec.resources.{key}", f"{key} = {value!r}")
    if kind == "missing-required":
        path = draw(st.sampled_from([("model",), ("dataset",), ("output",), ("dataset", "format")]))
        node = _get(spec, path[:-1]) if len(path) > 1 else spec
        if draw(st.booleans()):
            node.pop(path[-1], None)
        else:
            node[path[-1]] = None
        return SpecCase(spec, "invalid", dotted(path), f"{dotted(path)} missing or null")
    if kind == "too-many":
        which = draw(st.sampled_from(["nodeSelector", "tolerations", "targetModules"]))
        if which == "nodeSelector":
            spec.setdefault("placement", {})["nodeSelector"] = {f"k{i}": "v" for i in range(33)}
            return SpecCase(spec, "invalid", "spec.placement.nodeSelector", "33 node labels")
        if which == "tolerations":
            spec.setdefault("placement", {})["tolerations"] = [{"operator": "Exists"}] * 33
            return SpecCase(spec, "invalid", "spec.placement.tolerations", "33 tolerations")
        spec.setdefault("lora", {})["targetModules"] = [f"m{i}" for i in range(65)]
        return SpecCase(spec, "invalid", "spec.lora.targetModules", "65 target modules")
    # not-a-mapping
    value = draw(st.one_of(st.lists(st.integers(), max_size=3), st.text(max_size=10), st.integers()))
    return SpecCase(value, "invalid", "spec", f"spec is a {type(value).__name__}")


_KNOWN_ANYWHERE = {
    "model", "dataset", "lora", "quantization", "precision", "training", "checkpoints", "output", "resources",
    "placement", "image", "suspend", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "pvc",
    "hub", "storage", "merge", "r", "alpha", "dropout", "targetModules", "epochs", "maxSteps", "learningRate",
    "lrScheduler", "warmupRatio", "batchSize", "gradientAccumulation", "maxLength", "packing",
    "gradientCheckpointing", "optimizer", "weightDecay", "maxGradNorm", "loggingSteps", "seed", "gpus", "method",
    "dpo", "orpo", "beta", "lossType",
    "gpuProduct", "cpu", "memory",
}  # fmt: skip


@st.composite
def odd_but_legal_specs(draw: st.DrawFn) -> SpecCase:
    """Legal for the API models, but something downstream may refuse it: the operator must cope."""
    spec = draw(valid_specs())
    kind = draw(st.sampled_from(["unicode-selector", "huge-affinity", "huge-revision", "odd-affinity"]))
    placement = spec.setdefault("placement", {})
    if kind == "unicode-selector":
        placement["nodeSelector"] = {"team": draw(st.text(min_size=1, max_size=63))}
    elif kind == "huge-affinity":
        placement["affinity"] = {"nodeAffinity": {"note": "x" * draw(st.sampled_from([1000, 50_000]))}}
    elif kind == "odd-affinity":
        placement["affinity"] = draw(
            st.dictionaries(st.text(max_size=10), st.one_of(st.integers(), st.text(max_size=10)), max_size=3)
        )
    else:
        spec["model"]["source"] = {"hub": {"id": "org/model", "revision": draw(st.text(min_size=200, max_size=256))}}
    return SpecCase(spec, "either", None, kind)


def dotdot_cases(path: str) -> list[SpecCase]:
    """A spec per claim-relative path field, each set to `path` (one that leaves the claim)."""
    base: dict[str, Any] = {
        "model": {"source": {"pvc": {"claimName": "models"}}},
        "dataset": {"source": {"pvc": {"claimName": "datasets"}}, "format": "alpaca"},
        "output": {"pvc": {"claimName": "outputs"}},
    }
    cases = []
    for where in (("model", "source", "pvc", "path"), ("dataset", "source", "pvc", "path"), ("output", "pvc", "path")):
        spec = copy.deepcopy(base)
        _set(spec, where, path)
        cases.append(SpecCase(spec, "invalid", dotted(where), f"{dotted(where)} = {path!r}"))
    return cases


def spec_cases() -> st.SearchStrategy[SpecCase]:
    valid = valid_specs().map(lambda s: SpecCase(s, "valid", None, "valid"))
    return st.one_of(valid, mutated_specs(), mutated_specs(), odd_but_legal_specs())


def manifest(name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": name}, "spec": spec}


def deep_copy(case: SpecCase) -> SpecCase:
    return SpecCase(copy.deepcopy(case.spec), case.expect, case.field, case.what)
