"""A job's specification, checked once: the method's parameters with its published defaults and any preset
resolved, and the parameters of the connectivity curves the job measures (an unlearning job's curves use its
own margin). The service parses a request into one at submission and stores `stored()`; the worker rebuilds it
with `from_stored`, trusted, without checking it again. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lethe.engine.connectivity.params import MARGIN_FIELDS, ConnectivityParams
from lethe.engine.contract.chat_format import check_format
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.contract.parameters import SharedParams, trusted
from lethe.engine.methods import get_method, params_for


def _scoped(exc: EngineInputError, scope: str) -> EngineInputError:
    """The same error, its field named where it sits in the job ("params.lr", "mcu.space")."""
    return EngineInputError(str(exc), field=f"{scope}.{exc.field}" if exc.field else scope)


@dataclass(frozen=True)
class JobSpec:
    """What a job runs: checked once at submission, stored canonical, trusted by the worker."""
    params: SharedParams | None  # the method's parameters; None for a connectivity job
    preset: str | None = None  # as requested, already folded into params (kept as evidence)
    connectivity: ConnectivityParams | None = None  # the curves to measure
    format: str = "plain"  # how the records are shown to the model: "plain" or "chat" (contract.chat_format)

    @property
    def method(self) -> str | None:
        return self.params.method if self.params is not None else None

    @classmethod
    def unlearning(cls, method: str, values: dict | None = None, preset: str | None = None,
                   connectivity: dict | None = None, format: str = "plain") -> JobSpec:
        """An unlearning job; `connectivity`: the flat ConnectivityParams values of the curves it measures, if any.
        Errors name the field as "params.<name>" or "mcu.<name>" (the method and preset by their own names)."""
        try:
            params = params_for(method, values, preset)
        except EngineInputError as exc:
            raise (exc if exc.field in ("method", "preset") else _scoped(exc, "params")) from None
        curves = None
        if connectivity is not None:
            margin = params.margin()
            for name in MARGIN_FIELDS:
                if name in connectivity:
                    raise EngineInputError(
                        f"MCU parameter {name!r}: an unlearning job's curves use the job's own margin "
                        f"({name}={margin[name]}; set it in the job's params)", field=f"mcu.{name}")
            try:
                curves = ConnectivityParams.from_dict({**connectivity, **margin})
            except EngineInputError as exc:
                raise _scoped(exc, "mcu") from None
        return cls(params, preset, curves, check_format(format))

    @classmethod
    def curve(cls, values: dict | None = None, format: str = "plain") -> JobSpec:
        """A connectivity job on its own: its margin is its own to set (MASC's default otherwise)."""
        return cls(None, None, ConnectivityParams.from_dict(values), check_format(format))

    def stored(self) -> dict[str, Any]:
        """The specification as JSON, every parameter present."""
        return {"method": self.method, "preset": self.preset, "format": self.format,
                "params": self.params.as_dict() if self.params is not None else None,
                "connectivity": self.connectivity.as_dict() if self.connectivity is not None else None}

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> JobSpec:
        """What `stored` wrote, trusted: it was checked when the job was submitted. A parameter added since takes
        its default; one removed since must be dropped from stored jobs by a migration (as 0005 wrote them)."""
        params = get_method(stored["method"]).stored(stored["params"]) if stored.get("params") is not None else None
        curves = trusted(ConnectivityParams, stored["connectivity"]) if stored.get("connectivity") is not None else None
        return cls(params, stored.get("preset"), curves, stored.get("format", "plain"))
