"""What an operation is: one declaration from which every edge follows.

An :class:`Operation` names a service function (the only place its rule lives) and adds what
the edges need and the function cannot say: its HTTP method and path, the roles it admits,
the errors it may answer, a summary. Everything else is read from the service's own typed
signature: the inputs (keyword-only parameters, their types, defaults and pydantic
constraints), the output (its return annotation). The HTTP routes (``api.operations``), the
remote client (``api.client``), the embedded backend (``registry.contract.local``) and the
typed interface (``registry.contract.interface``, generated) are all derived from it.

Parameters a caller does not choose are filled by the edge that runs the operation:
``actor`` (who acts: the token's name over HTTP, the OS user embedded) and any parameter
listed in ``context`` (e.g. the server's own signing key, or the artifact roots a remote
registrar is confined to).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from registry.errors import InvalidInput, PairregError
from registry.governance.roles import Duty
from registry.settings import Settings

HttpMethod = Literal["GET", "POST", "PUT", "DELETE"]
ParamLocation = Literal["path", "query", "body", "text"]

_PATH_PARAM = re.compile(r"\{(\w+)(?::path)?\}")
# Parameters the edges fill in themselves; never part of an operation's input.
EDGE_PARAMS = frozenset({"session", "actor"})


@dataclass(frozen=True)
class CallContext:
    """What the edge running an operation knows about the call, for ``context`` values.

    ``remote`` is True when a client over HTTP asked (the server acts for someone else and
    confines what it may touch); False when the embedded CLI acts as the local user.
    """

    settings: Settings
    remote: bool


ContextValue = Callable[[CallContext], Any]


@dataclass(frozen=True)
class Param:
    """One input of an operation, as the service declares it."""

    name: str
    annotation: Any  # resolved, with ``Annotated`` metadata kept
    default: Any  # ``inspect.Parameter.empty`` when required
    location: ParamLocation
    wire_name: str  # the name on the wire (query alias), usually ``name``

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty

    @property
    def field_info(self) -> FieldInfo | None:
        if typing.get_origin(self.annotation) is typing.Annotated:
            for meta in reversed(typing.get_args(self.annotation)[1:]):
                if isinstance(meta, FieldInfo):
                    return meta
        return None


@dataclass(frozen=True)
class Operation:
    """One operation of the registry. See the module docstring."""

    service: Callable[..., Any]
    method: HttpMethod
    path: str | None
    roles: frozenset[str]
    summary: str
    tag: str
    errors: tuple[type[PairregError], ...] = ()
    status: int = 200
    # When the result says nothing changed (e.g. identical content was already registered),
    # answer ``unchanged_status`` instead of ``status``: (predicate on the result, status).
    unchanged: tuple[Callable[[Any], bool], int, str] | None = None
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    wire_names: Mapping[str, str] = field(default_factory=dict)
    text_body: str | None = None  # a parameter sent as the raw text/plain body
    also_get: bool = False  # also answer GET with every body parameter at its default
    response_model: Any = None  # documented shape when the annotation is too loose (a dict)
    examples: tuple[dict[str, Any], ...] = ()
    local_only: str | None = None  # why this runs only against the database (no route)
    json_body_direct: bool = False  # large bodies: validated from the bytes (api/json_body.py)
    # Faster still for the largest: a decoder of the body's bytes that returns its fields
    # already checked, or None when unsure (the body model then validates it as above).
    json_body_fast: Callable[[bytes], dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        # Roles follow from a duty (registry/governance/roles.py), never an ad-hoc set of roles.
        if not isinstance(self.roles, Duty):
            raise TypeError(
                f"{self.service.__name__}: roles must be a registry.governance.roles.Duty"
            )

    @property
    def duty(self) -> str:
        """The name of the duty this operation belongs to (its roles follow from it)."""
        assert isinstance(self.roles, Duty)
        return self.roles.name

    @property
    def name(self) -> str:
        return self.service.__name__

    @property
    def description(self) -> str:
        return inspect.cleandoc(self.service.__doc__ or "")

    @cached_property
    def _signature(self) -> inspect.Signature:
        return inspect.signature(self.service)

    @cached_property
    def _hints(self) -> dict[str, Any]:
        return typing.get_type_hints(self.service, include_extras=True)

    @cached_property
    def takes_actor(self) -> bool:
        return "actor" in self._signature.parameters

    @cached_property
    def params(self) -> tuple[Param, ...]:
        """The caller's inputs, in declaration order, each with where it travels."""
        path_names = set(_PATH_PARAM.findall(self.path or ""))
        out = []
        for name, p in self._signature.parameters.items():
            if name in EDGE_PARAMS or name in self.context:
                continue
            if p.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise TypeError(f"{self.name}: parameter {name} must be keyword-only")
            if name in path_names:
                location: ParamLocation = "path"
            elif name == self.text_body:
                location = "text"
            elif self.method in ("GET", "DELETE") or self.text_body is not None:
                location = "query"
            else:
                location = "body"
            out.append(
                Param(
                    name=name,
                    annotation=self._hints[name],
                    default=p.default,
                    location=location,
                    wire_name=self.wire_names.get(name, name),
                )
            )
        missing = path_names - {p.name for p in out}
        if missing:
            raise TypeError(f"{self.name}: path names {sorted(missing)} the service lacks")
        return tuple(out)

    def params_in(self, *locations: ParamLocation) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.location in locations)

    @cached_property
    def output(self) -> Any:
        return self._hints["return"]

    @cached_property
    def input_model(self) -> type[BaseModel]:
        """Every input in one strict model: what the embedded backend validates kwargs with."""
        return _model(f"{_camel(self.name)}Call", self.params, wire=False)

    @cached_property
    def body_model(self) -> type[BaseModel] | None:
        """The JSON request body (fields by their wire names), when the operation takes one."""
        body = self.params_in("body")
        if not body:
            return None
        extra = {"examples": list(self.examples)} if self.examples else None
        return _model(f"{_camel(self.name)}Request", body, wire=True, schema_extra=extra)

    def check(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Validate a local call's keyword arguments exactly as the HTTP edge would."""
        try:
            model = self.input_model.model_validate(kwargs)
        except ValidationError as exc:
            raise invalid_input(exc) from None
        return {p.name: getattr(model, p.name) for p in self.params if p.name in kwargs}

    @cached_property
    def error_statuses(self) -> tuple[int, ...]:
        """HTTP statuses this operation may answer with a problem, beyond 401/403/422."""
        return tuple(sorted({e.status for e in self.errors if e.status not in (401, 403, 422)}))

    def status_for(self, result: Any) -> int:
        if self.unchanged is not None and self.unchanged[0](result):
            return self.unchanged[1]
        return self.status

    def context_values(self, ctx: CallContext) -> dict[str, Any]:
        return {name: fn(ctx) for name, fn in self.context.items()}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _model(
    name: str, params: tuple[Param, ...], *, wire: bool, schema_extra: Any = None
) -> type[BaseModel]:
    """A strict model of ``params``: no coercion of "1" to 1, no unknown fields."""
    fields: dict[str, Any] = {}
    for p in params:
        default = ... if p.required else p.default
        annotation = p.annotation
        if wire and p.wire_name != p.name:
            annotation = Annotated[annotation, Field(alias=p.wire_name)]
        fields[p.name] = (annotation, default)
    config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra=schema_extra, populate_by_name=not wire
    )
    return create_model(name, __config__=config, **fields)


def describe_error(error: Mapping[str, Any], loc: tuple[Any, ...] | None = None) -> str:
    """One pydantic error in the registry's own words ("k must be ..."), the same in both
    backends: the HTTP edge formats request validation errors with this too."""
    where = ".".join(str(x) for x in (loc if loc is not None else error.get("loc", ())))
    where = where or "input"
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind == "literal_error" and "expected" in ctx:
        expected = str(ctx["expected"]).replace("'", "").replace(" or ", ", ")
        return f"{where} must be one of {expected}"
    if kind == "missing":
        return f"{where} is required"
    if kind == "extra_forbidden":
        return f"{where} is not a known field"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds and bounds[kind][1] in ctx:
        words, key = bounds[kind]
        return f"{where} must be {words} {ctx[key]}"
    return f"{where}: {error.get('msg', 'invalid')}"


def invalid_input(exc: ValidationError) -> InvalidInput:
    """The first validation error as one readable line naming the field."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid"}
    field_name = ".".join(str(x) for x in first.get("loc", ())) or "input"
    return InvalidInput(describe_error(first), field=field_name)
