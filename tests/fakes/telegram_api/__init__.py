"""A local fake of the Telegram Bot API that speaks the real wire protocol, for driving the real
python-telegram-bot client in tests.

Requests are POSTs (form-encoded with JSON-encoded values, or a JSON body) to `/bot<token>/<method>`;
answers are `{"ok": true, "result": ...}` or `{"ok": false, "error_code": N, "description": ...,
"parameters": {...}}`. Files download from `/file/bot<token>/<file_path>`, streamed in chunks with
their Content-Length; with `local_dir` the fake is a local Bot API server in --local mode instead:
getFile names the file as an absolute path under `local_dir/<token>/`, where it was written, and
nothing is served over HTTP. It keeps Telegram's
semantics where a client could get them wrong: getUpdates drops updates below `offset` (they are
confirmed), holds a long poll open for `timeout` seconds, and ends an older poll with 409 when a
newer one arrives; message ids count per chat; entities (mentions, commands) are computed by the
server; HTML text is checked and its visible text is limited to 4096 characters.

Test helpers: `send` / `send_document` / `send_voice` / `send_photo` (a user writes; `topic=`: in
a forum topic, where a bot message sent without `message_thread_id` lands in General), `add_update`
(any raw update), `texts(chat)` (what the bot's messages in a chat show now), `fail_next` (queue an
error such as 429 with retry_after for a method's next call; "download" for the next file
download), `cut_next_download` (the connection breaks or stalls partway through a file),
`downloads` (what each file download sent before it ended), `reject_formatting`, `migrate` (a
group becomes a supergroup: its service messages, then every call to the old id is refused with
the new one), and `stop()` /
`start()` on the same port to make the service go away and come back. A file's content may be
`Generated(size)`: its bytes are made as they are sent, never held whole.
"""

from tests.fakes.telegram_api.files import Download, Generated
from tests.fakes.telegram_api.server import FakeTelegram
from tests.fakes.telegram_api.wire import BotMessage, Call

__all__ = ["BotMessage", "Call", "Download", "FakeTelegram", "Generated"]
