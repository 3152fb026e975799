"""Hardware profiles: the figures the roofline model needs, kept as data.

A profile says how much memory a device has, how fast it streams it (bytes/s), its dense
FLOPS by dtype, optionally a price per hour, and a fixed cost per forward pass
(``step_overhead_s`` plus ``layer_overhead_s`` × layers: kernel launches and framework
time, which dominate small models on a CPU and are near zero for large models on a GPU).

Profiles come from three places, later ones overriding earlier ones by name:

* shipped (``profiles/shipped.toml``), from vendor datasheets, each naming its document;
* measured, written by ``pairreg hardware measure`` on the runner's machine;
* the user's own TOML files under ``$PAIRREG_HOME/hardware/`` (same keys).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from registry.errors import InvalidInput, NotFound

SHIPPED = Path(__file__).resolve().parent / "profiles" / "shipped.toml"
_KEYS = {
    "name",
    "description",
    "memory_bytes",
    "memory_bandwidth",
    "flops",
    "price_per_hour",
    "step_overhead_s",
    "layer_overhead_s",
    "source",
    "kind",
    "measured_at",
}


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    memory_bytes: float
    memory_bandwidth: float
    flops: dict[str, float]
    description: str = ""
    price_per_hour: float | None = None
    step_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    source: str = ""
    kind: str = "shipped"  # shipped | measured | user
    measured_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def flops_for(self, dtype: str) -> float:
        """Dense FLOPS for ``dtype``; an unknown 8-bit type reads ``float8``, else the
        nearest wider type the profile lists."""
        d = {"float8_e4m3fn": "float8", "float8_e5m2": "float8", "half": "float16"}.get(
            dtype, dtype
        )
        for name in (d, "bfloat16", "float16", "float32"):
            if name in self.flops:
                return float(self.flops[name])
        raise InvalidInput(f"hardware {self.name} lists no FLOPS", field="hardware")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        return out


def _positive(name: str, key: str, value: Any, *, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"hardware profile {name}: {key} must be a number", field=key)
    if value < 0 or (value == 0 and not zero_ok):
        raise InvalidInput(f"hardware profile {name}: {key} must be positive", field=key)
    return float(value)


def profile_from_dict(data: dict[str, Any], *, kind: str) -> HardwareProfile:
    """Check one profile table; unknown keys are refused so a typo cannot pass silently."""
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or " " in name or len(name) > 100:
        raise InvalidInput("a hardware profile needs a name without spaces", field="name")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise InvalidInput(
            f"hardware profile {name}: unknown key {unknown[0]!r}", field=f"hardware.{unknown[0]}"
        )
    flops = data.get("flops")
    if not isinstance(flops, dict) or not flops:
        raise InvalidInput(f"hardware profile {name}: flops must be a table", field="flops")
    price = data.get("price_per_hour")
    return HardwareProfile(
        name=name,
        description=str(data.get("description", "")),
        memory_bytes=_positive(name, "memory_bytes", data.get("memory_bytes")),
        memory_bandwidth=_positive(name, "memory_bandwidth", data.get("memory_bandwidth")),
        flops={str(k): _positive(name, f"flops.{k}", v) for k, v in flops.items()},
        price_per_hour=None if price is None else _positive(name, "price_per_hour", price),
        step_overhead_s=_positive(
            name, "step_overhead_s", data.get("step_overhead_s", 0.0), zero_ok=True
        ),
        layer_overhead_s=_positive(
            name, "layer_overhead_s", data.get("layer_overhead_s", 0.0), zero_ok=True
        ),
        source=str(data.get("source", "")),
        kind=str(data.get("kind", kind)),
        measured_at=data.get("measured_at"),
    )


def _read(path: Path, kind: str) -> list[HardwareProfile]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"hardware profile file {path.name}: {exc}", field="hardware") from exc
    tables = data.get("profile", [data] if "name" in data else [])
    return [profile_from_dict(t, kind=kind) for t in tables]


def user_dir(home: str | Path) -> Path:
    return Path(home).expanduser() / "hardware"


def load_profiles(home: str | Path | None = None) -> dict[str, HardwareProfile]:
    """Every known profile by name: shipped, then the home's (measured or user-written)."""
    out = {p.name: p for p in _read(SHIPPED, "shipped")}
    if home is not None:
        d = user_dir(home)
        if d.is_dir():
            for path in sorted(d.glob("*.toml")):
                for p in _read(path, "user"):
                    out[p.name] = p
    return out


def get_profile(name: str, home: str | Path | None = None) -> HardwareProfile:
    profiles = load_profiles(home)
    if name not in profiles:
        raise NotFound(
            f"no hardware profile {name!r}; known: {', '.join(sorted(profiles))}",
            field="hardware",
        )
    return profiles[name]


def profile_toml(p: HardwareProfile) -> str:
    """A profile as a TOML file (for ``pairreg hardware measure`` to write)."""

    def val(v: Any) -> str:
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(float(v))

    lines = [f"name = {val(p.name)}", f"description = {val(p.description)}"]
    lines += [
        f"memory_bytes = {val(p.memory_bytes)}",
        f"memory_bandwidth = {val(p.memory_bandwidth)}",
        "flops = { " + ", ".join(f"{k} = {val(v)}" for k, v in sorted(p.flops.items())) + " }",
        f"step_overhead_s = {val(p.step_overhead_s)}",
        f"layer_overhead_s = {val(p.layer_overhead_s)}",
    ]
    if p.price_per_hour is not None:
        lines.append(f"price_per_hour = {val(p.price_per_hour)}")
    lines += [f"source = {val(p.source)}", f'kind = "{p.kind}"']
    if p.measured_at:
        lines.append(f"measured_at = {val(p.measured_at)}")
    return "\n".join(lines) + "\n"
