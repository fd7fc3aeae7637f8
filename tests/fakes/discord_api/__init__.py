"""A local fake Discord for tests: the REST API (v10) and the websocket gateway on 127.0.0.1, speaking
enough of the real wire protocol that the real discord.py client logs in, identifies, resumes,
receives messages and slash commands, and answers them.

One bot (one token, one application) and one guild with one text channel. Tests inject what users
do (`send_dm`, `send_guild_message`, each with optional `files`; `slash`), read what the bot did
(`texts`, `typing`, `interactions`, `cdn_requests`), and break things: `fail` queues an error
answer for a route, `drop_websocket` cuts the gateway connection, `stop()` / `start()` take the
whole server away and bring it back on the same port (sessions and messages survive, as they do at
Discord).

Files users attach are served as Discord's CDN serves them: at the attachment's `url` (here on this
server, `/attachments/<channel>/<attachment>/<name>?ex=..&is=..&hm=..`), without the bot token, and
404 without the URL's signature or once the URL expired (`ex`, hex Unix time: a day after the upload,
or `attachment_url_lifetime` seconds).
"""

from tests.fakes.discord_api.server import FakeDiscord, Recorded, Upload

__all__ = ["FakeDiscord", "Recorded", "Upload"]
