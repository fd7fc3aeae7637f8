"""The fake Discord's JSON: users, members, the guild and its channel, the application, and the
answers Discord gives (its content check, an injected failure, JSON with Discord's exact type)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

API = "/api/v10"
JSON = "application/json"  # exactly this: discord.py only decodes bodies whose type has no charset


def user_json(user_id: int, name: str | None = None, *, bot: bool = False) -> dict:
    name = name or f"user{str(user_id)[-4:]}"
    return {"id": str(user_id), "username": name, "global_name": name.title(),
            "discriminator": "0", "avatar": None, "bot": bot, "public_flags": 0}


def application_json(application_id: int, bot: dict, owner: dict) -> dict:
    return {"id": str(application_id), "name": bot["username"], "icon": None,
            "description": "", "bot_public": False, "bot_require_code_grant": False,
            "owner": owner, "verify_key": "0" * 64, "flags": 0, "team": None,
            "bot": bot, "rpc_origins": [], "interactions_endpoint_url": None,
            "redirect_uris": [], "tags": []}


def member_json() -> dict:
    return {"roles": [], "joined_at": now(), "deaf": False, "mute": False, "flags": 0,
            "nick": None, "avatar": None}


def guild_channel_json(guild_id: int, channel_id: int) -> dict:
    return {"id": str(channel_id), "type": 0, "name": "general",
            "guild_id": str(guild_id), "position": 0, "permission_overwrites": [],
            "nsfw": False, "topic": None, "last_message_id": None, "rate_limit_per_user": 0,
            "parent_id": None}


def guild_json(guild_id: int, channel_id: int, owner: dict, bot: dict) -> dict:
    everyone = {"id": str(guild_id), "name": "@everyone", "permissions": "1071698660929",
                "position": 0, "color": 0, "hoist": False, "managed": False,
                "mentionable": False, "flags": 0}
    return {"id": str(guild_id), "name": "Test guild", "owner_id": owner["id"],
            "unavailable": False, "large": False, "member_count": 3, "joined_at": now(),
            "roles": [everyone], "channels": [guild_channel_json(guild_id, channel_id)],
            "members": [{**member_json(), "user": bot}], "emojis": [], "stickers": [],
            "features": [], "threads": [], "stage_instances": [], "guild_scheduled_events": [],
            "presences": [], "voice_states": [], "soundboard_sounds": [],
            "preferred_locale": "en-US", "premium_tier": 0, "verification_level": 0,
            "default_message_notifications": 0, "explicit_content_filter": 0, "mfa_level": 0,
            "nsfw_level": 0, "system_channel_flags": 0, "afk_timeout": 300}


def check_content(content: Any) -> web.Response | None:
    """Discord's validation of a message's text: present, and at most 2000 characters."""
    if not isinstance(content, str) or not content:
        return json_response({"message": "Cannot send an empty message", "code": 50006}, 400)
    if len(content) > 2000:
        return json_response({"message": "Invalid Form Body", "code": 50035, "errors": {"content": {
            "_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                         "message": "Must be 2000 or fewer in length."}]}}}, 400)
    return None


def failure_response(status: int, retry_after: float) -> web.Response:
    """An injected failure as Discord answers it; a 429 carries retry_after in body and header."""
    if status != 429:
        return json_response({"message": f"{status}: injected failure", "code": 0}, status)
    body = {"message": "You are being rate limited.", "retry_after": retry_after,
            "global": False}
    # Via marks the answer as Discord's own (a 429 without it comes from Cloudflare: a ban)
    return json_response(body, 429, headers={"Retry-After": str(retry_after), "Via": "1.1 google",
                                             "X-RateLimit-Scope": "user"})


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), status=status,
                        headers={"Content-Type": JSON, **(headers or {})})


def now() -> str:
    return datetime.now(UTC).isoformat()
