"""The fake Discord's websocket gateway: HELLO, heartbeats, IDENTIFY (READY) and RESUME, sessions
that keep what they were sent so a RESUME replays what a client missed, and events dispatched to
the latest identified session as its intents let it see them."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import WSMsgType, web

# gateway opcodes and the intents this fake honours
DISPATCH, HEARTBEAT, IDENTIFY, RESUME, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 0, 1, 2, 6, 9, 10, 11
GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT = 1 << 0, 1 << 9, 1 << 12, 1 << 15
GUILD_MESSAGE_REACTIONS, DIRECT_MESSAGE_REACTIONS = 1 << 10, 1 << 13
REACTION_EVENTS = ("MESSAGE_REACTION_ADD", "MESSAGE_REACTION_REMOVE")


class Service(Protocol):
    """What the gateway asks of the fake Discord it belongs to."""

    token: str
    bot: dict  # the bot's user
    message_content_intent: bool  # the developer portal's switch for the privileged intent

    def ready_events(self, session_id: str, intents: int) -> list[tuple[str, dict]]:
        """The events a session gets once identified: READY, then what its intents add."""
        ...


@dataclass
class Session:
    """A gateway session: what it was sent (for RESUME) and the socket it is on, if any."""

    id: str
    intents: int
    seq: int = 0
    sent: list[dict] = field(default_factory=list)
    conn: Connection | None = None


class Connection:
    """One websocket; frames go out in order through a single writer."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.outbox: asyncio.Queue[dict | int] = asyncio.Queue()  # a frame, or a close code
        self.writer = asyncio.create_task(self._write())

    def send(self, frame: dict) -> None:
        self.outbox.put_nowait(frame)

    def close(self, code: int) -> None:
        self.outbox.put_nowait(code)

    async def _write(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, int):
                await self.ws.close(code=item)
                return
            try:
                await self.ws.send_str(json.dumps(item))
            except (ConnectionError, RuntimeError):
                return  # the client went away; what it missed is replayed on RESUME


class Gateway:
    """The gateway's sessions and connections; `identifies` and `resumes` count what clients did."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.identifies = 0
        self.resumes = 0
        self.sessions: dict[str, Session] = {}
        self.current: Session | None = None  # the latest identified session: events go there
        self.conns: set[Connection] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = Connection(ws)
        self.conns.add(conn)
        conn.send({"op": HELLO, "d": {"heartbeat_interval": 41_250}, "s": None, "t": None})
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                payload = json.loads(frame.data)
                op, data = payload.get("op"), payload.get("d")
                if op == HEARTBEAT:
                    conn.send({"op": HEARTBEAT_ACK, "d": None, "s": None, "t": None})
                elif op == IDENTIFY:
                    self._identify(conn, data)
                elif op == RESUME:
                    self._resume(conn, data)
        finally:
            self.conns.discard(conn)
            for session in self.sessions.values():
                if session.conn is conn:
                    session.conn = None
            conn.close(1000)
        return ws

    async def close(self) -> None:
        """The network goes away: every socket closes (1001, going away)."""
        for conn in list(self.conns):
            conn.close(1001)
        await asyncio.gather(*(c.writer for c in list(self.conns)), return_exceptions=True)

    def drop(self, code: int) -> None:
        """Close the latest session's connection now; its events wait for a RESUME."""
        session = self.current
        if session is not None and session.conn is not None:
            session.conn.close(code)
            session.conn = None

    def forget_sessions(self) -> None:
        for session in self.sessions.values():
            if session.conn is not None:
                session.conn.close(4000)
        self.sessions.clear()
        self.current = None

    def dispatch(self, event: str, data: dict) -> None:
        session = self.current
        seen = None if session is None else _wanted(session.intents, event, data, self.service.bot["id"])
        if seen is not None:
            self._send(session, event, seen)

    def _identify(self, conn: Connection, data: dict) -> None:
        if data.get("token") != self.service.token:
            conn.close(4004)  # Authentication failed
            return
        if int(data.get("intents", 0)) & MESSAGE_CONTENT and not self.service.message_content_intent:
            conn.close(4014)  # Disallowed intent(s)
            return
        self.identifies += 1
        session = Session(uuid.uuid4().hex, int(data.get("intents", 0)), conn=conn)
        self.sessions[session.id] = session
        self.current = session
        for event, payload in self.service.ready_events(session.id, session.intents):
            self._send(session, event, payload)

    def _resume(self, conn: Connection, data: dict) -> None:
        session = self.sessions.get(data.get("session_id", ""))
        if session is None or data.get("token") != self.service.token:
            conn.send({"op": INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        self.resumes += 1
        session.conn = conn
        self.current = session
        for frame in session.sent:  # what it missed, in order, then RESUMED
            if frame["s"] > (data.get("seq") or 0):
                conn.send(frame)
        self._send(session, "RESUMED", {})

    def _send(self, session: Session, event: str, data: dict) -> None:
        session.seq += 1
        frame = {"op": DISPATCH, "s": session.seq, "t": event, "d": json.loads(json.dumps(data))}
        session.sent.append(frame)
        if session.conn is not None:
            session.conn.send(frame)


def _wanted(intents: int, event: str, data: dict, bot_id: str) -> dict | None:
    """The event as a session with these intents receives it, or None if it does not."""
    if event in REACTION_EVENTS:
        wanted = GUILD_MESSAGE_REACTIONS if "guild_id" in data else DIRECT_MESSAGE_REACTIONS
        return data if intents & wanted else None
    if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
        return data
    in_guild = "guild_id" in data
    if not intents & (GUILD_MESSAGES if in_guild else DIRECT_MESSAGES):
        return None
    addressed = not in_guild or any(m["id"] == bot_id for m in data.get("mentions", []))
    if not intents & MESSAGE_CONTENT and not addressed and data["author"]["id"] != bot_id:
        # a privileged intent: without it, guild chatter comes without its text and files
        return {**data, "content": "", "attachments": [], "embeds": []}
    return data
