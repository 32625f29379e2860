"""The parameter list of a generated wrapper: the same signature as the collective it wraps, defaults passed by name."""

from __future__ import annotations

import inspect


def signature_source(signature: inspect.Signature) -> tuple:
    """(parameter list, call passing them on, {default name: value}) for a generated function with this signature.

    Defaults are passed by name, never by repr: the generated function gets the very same default objects.
    """
    P = inspect.Parameter
    params: list = []
    call: list = []
    defaults: dict = {}
    for name, param in signature.parameters.items():
        default = ""
        if param.default is not P.empty:
            defaults[f"_w_default_{name}"] = param.default
            default = f"=_w_default_{name}"
        if params and param.kind is not P.POSITIONAL_ONLY and _last_kind(signature, params) is P.POSITIONAL_ONLY:
            params.append("/")
        if param.kind is P.KEYWORD_ONLY and not any(p.startswith("*") for p in params):
            params.append("*")  # the first keyword-only parameter, with no *args before it
        prefix = "*" if param.kind is P.VAR_POSITIONAL else "**" if param.kind is P.VAR_KEYWORD else ""
        params.append(f"{prefix}{name}{default}")
        call.append(f"{name}={name}" if param.kind is P.KEYWORD_ONLY else f"{prefix}{name}")
    if params and _last_kind(signature, params) is P.POSITIONAL_ONLY:
        params.append("/")
    return ", ".join(params), ", ".join(call), defaults


def _last_kind(signature: inspect.Signature, params: list):
    """The kind of the parameter last written to `params` (None after a "*" or "/" marker)."""
    last = params[-1].lstrip("*").split("=")[0] if params else ""
    return signature.parameters[last].kind if last in signature.parameters else None
