"""Tools to offer a model in the engine's tool-call tests."""

# Argument types a random model can finish: its free strings would run to max_tokens.
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                         "days": {"type": "integer"},
                                         "hourly": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "set_volume", "parameters": {
        "type": "object", "properties": {"level": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
                                                                    "properties": {}}}},
]
