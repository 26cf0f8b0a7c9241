"""Shared pieces of the API models: the base class and the Kubernetes-shaped field types."""

from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# A Kubernetes label key: an optional DNS-subdomain prefix and a name of at most 63 characters.
LABEL_KEY_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class ApiModel(BaseModel):
    """Frozen, camelCase on the wire, snake_case in Python; unknown fields are errors.

    `extra="forbid"` is what turns a typo such as `lora.rank` into an error instead of a
    silently ignored field; the CRD gets the same effect from structural pruning plus
    kubectl's strict field validation.

    `defer_build`: a model's schema is built on its first use, not when its module is imported,
    so that what a registry adds to a model (an objective's `training.<method>` block,
    finetune_api.method_settings) is read once the registry is found whole, FINETUNE_PLUGINS's
    entries too, and importing the API imports none of them.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        defer_build=True,
    )


def _number_to_string(value: Any) -> Any:
    # YAML turns `cpu: 4` into an int; Kubernetes quantities accept both spellings.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"

Quantity = Annotated[
    str,
    BeforeValidator(_number_to_string),
    Field(pattern=QUANTITY_PATTERN, max_length=32),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]

# DNS-1123 subdomain: the rule for names of PVCs, Secrets, PriorityClasses.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ResourceName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
# A Kueue object's name carried in a Job label (`kueue.x-k8s.io/queue-name`, `.../priority-class`):
# an object name that is also a label value, which Kueue's Job webhook checks.
KueueName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_SUBDOMAIN_PATTERN)]

# A relative path inside a volume: no leading slash, no `..` segment, so a spec can never
# point a mount outside its claim.
_SEGMENT = r"(\.{3,}|[^/]*[^/.][^/]*)"  # any name but "." and ".."
RELATIVE_PATH_PATTERN = rf"^({_SEGMENT}(/{_SEGMENT})*)?$"
RelativePath = Annotated[str, Field(max_length=1024, pattern=RELATIVE_PATH_PATTERN)]


def _positive(quantity: str) -> str:
    # Runs after the pattern check: the number is everything before the unit suffix.
    number = quantity.rstrip("mkKMGTPEi")
    if float(number) <= 0:
        raise ValueError("must be greater than zero")
    return quantity


PositiveQuantity = Annotated[Quantity, AfterValidator(_positive)]

ShortString = Annotated[str, Field(min_length=1, max_length=253)]
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelMap = Annotated[
    dict[
        Annotated[str, Field(max_length=317, pattern=LABEL_KEY_PATTERN)],
        Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)],
    ],
    Field(max_length=32),
]

AnyObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
