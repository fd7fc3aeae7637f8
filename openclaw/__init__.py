"""The OpenClaw-py daemon: config, store, gateway, agent loop, scheduler, CLI, service."""

__version__ = "0.1.0"
