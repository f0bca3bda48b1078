"""Evaluate a ValidatingAdmissionPolicy on an admission request, with a real CEL interpreter.

No API server runs here, so the policy's CEL (matchConditions, variables, validations,
messageExpression) is run by cel-python in the order the API server uses: a request outside
``matchConstraints`` or failing a match condition is not the policy's business; otherwise
every validation must be true. An expression that fails to evaluate denies the request, as
``failurePolicy: Fail`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import celpy

Verdict = tuple[bool, str]  # allowed, and the denial message


@functools.cache
def _program(expression: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    result = _program(expression).evaluate(dict(activation))
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def _map(values: Mapping[str, Any]) -> Any:
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


def _matches(policy: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    resource = request["resource"]
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        if (
            resource["group"] in rule["apiGroups"]
            and ("*" in rule["apiVersions"] or resource["version"] in rule["apiVersions"])
            and resource["resource"] in rule["resources"]
            and request["operation"] in rule["operations"]
        ):
            return True
    return False


def review(
    policy: Mapping[str, Any],
    request: Mapping[str, Any],
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
) -> Verdict:
    """Whether the policy lets ``request`` (with the object before and after) through."""
    if not _matches(policy, request):
        return True, ""
    spec = policy["spec"]
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(dict(request)),
        "object": celpy.json_to_cel(None if new is None else dict(new)),
        "oldObject": celpy.json_to_cel(None if old is None else dict(old)),
    }
    try:
        for condition in spec.get("matchConditions") or []:
            if not bool(_evaluate(condition["expression"], activation)):
                return True, ""
        variables: dict[str, Any] = {}
        for variable in spec.get("variables") or []:  # each may use the ones before it
            activation["variables"] = _map(variables)
            variables[variable["name"]] = _evaluate(variable["expression"], activation)
        activation["variables"] = _map(variables)
        for validation in spec["validations"]:
            if bool(_evaluate(validation["expression"], activation)):
                continue
            if "messageExpression" in validation:
                return False, str(_evaluate(validation["messageExpression"], activation))
            return False, str(validation.get("message", "denied"))
    except celpy.CELEvalError as exc:
        if spec.get("failurePolicy", "Fail") == "Fail":
            return False, f"policy evaluation failed: {exc}"
        return True, ""
    return True, ""
