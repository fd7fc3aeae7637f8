"""A small JSON Schema validator for the subset the structured-output and tool-grammar tests
use (jsonschema is not a dependency): type, enum, const, properties, required, additionalProperties, items,
min/maxItems, minimum/maximum (and exclusive), min/maxLength, anyOf."""

from __future__ import annotations

from typing import Any

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    # Stricter than JSON Schema (which counts 1.0 as an integer): the grammars write integers
    # as integers, and a 1.0 where an integer was asked is their mistake.
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def schema_errors(value: Any, schema: Any, path: str = "$") -> list[str]:
    """What in `value` breaks `schema` (empty when it validates; a schema that is not an object,
    or a type not listed above, allows anything)."""
    if not isinstance(schema, dict):
        return []
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return [f"{path}: {value!r:.60} is not of type {kind}"]
    # By type too: True == 1 in Python, not in JSON.
    if "enum" in schema and not any(type(value) is type(e) and value == e for e in schema["enum"]):
        errors.append(f"{path}: {value!r:.60} is not one of {schema['enum']!r:.80}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} is not {schema['const']!r}")
    if "anyOf" in schema and not any(not schema_errors(value, s, path) for s in schema["anyOf"]):
        errors.append(f"{path}: {value!r} matches none of anyOf")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += schema_errors(item, props[key], f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}: unexpected property {key!r}")
            else:
                errors += schema_errors(item, extra, f"{path}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1 << 30):
            errors.append(f"{path}: {len(value)} items is outside minItems/maxItems")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items"), f"{path}[{i}]")
    if isinstance(value, str) and not (schema.get("minLength", 0) <= len(value)
                                       <= schema.get("maxLength", 1 << 30)):
        errors.append(f"{path}: length {len(value)} is outside minLength/maxLength")
    if _TYPES["number"](value):
        bounds = [("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b),
                  ("exclusiveMinimum", lambda b: value > b), ("exclusiveMaximum", lambda b: value < b)]
        errors += [f"{path}: {value} breaks {name} {schema[name]}" for name, ok in bounds
                   if name in schema and not ok(schema[name])]
    return errors
