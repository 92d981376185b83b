"""The JSON Schemas the API scripts share: a capital in JSON, and a tool call's shape.

The bundled small model does not call tools on its own, so a JSON Schema holds its reply to
a call's shape, which mistral.rs reads as a call.
"""

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

CAPITAL = {
    "type": "object",
    "properties": {"capital": {"type": "string"}},
    "required": ["capital"],
    "additionalProperties": False,
}

WEATHER_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": dict(CITY, additionalProperties=False),
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
