"""ZeroMQ links between the coordinator and the other roles, on asyncio.

One ROUTER socket (`Hub`, in the coordinator) and one DEALER socket per other role (`Link`).
Every ZeroMQ message is one frame (codec's docstring says why) and passes through `codec`: one
that does not decode is dropped with a logged, counted reason (`rejected`), and the socket
carries on. Messages bound for one peer at the same moment travel as one bundle (`codec.pack`):
the hub's `send_all`, and a link's sends made in the same turn of the event loop (a rollout
worker's answers to one engine step).

Backpressure has two layers. The application gives credits: the coordinator never has more
than a cap of requests in flight per worker, the trainer asks for each batch. Below that, the
high-water marks bound what sits in ZeroMQ's queues; the ROUTER is `ROUTER_MANDATORY`, so at
the mark a send waits (or fails for a peer that is gone) instead of silently dropping, which is
ROUTER's default.

Security: sockets bind to loopback unless configured otherwise. Between hosts, `curve_keys` (a
directory made by `flashq keys`) turns on CurveZMQ: traffic is encrypted, and the hub admits only
peers holding a client key from that directory (a ZAP authenticator checks each handshake); a
peer without one never gets a frame through. Names are proven, not claimed: each link connects
under its role's name and a random suffix (so no two connections share a ZeroMQ identity), and a
hub given `credentials` hears a connection only once its `Hello` carried the name's token
(flashq/credentials.py); the name is then routed to that connection alone, until a newer one
proves the same name (a restarted role). Everything else sent under a name is refused, counted.
Without CurveZMQ the token is also checked at the handshake (ZeroMQ's PLAIN mechanism, user name
and password = role name and token): a peer holding no role's token never gets a frame into the
coordinator, so it cannot make libzmq buffer anything (a multi-part message is held whole, up to
the size limit per part and the high-water mark in messages, before the application sees it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections import Counter, deque
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from flashq.wire.codec import (BUNDLE_BYTES, BUNDLE_HEADER_BYTES, MAX_BUNDLE, Decoder, Encoder, RejectedFrame, bundled_nbytes,
                               pack, unpack)
from flashq.wire.protocol import Hello, Message

log = logging.getLogger(__name__)


class PeerLost(RuntimeError):
    """A peer stopped answering (no frame within the liveness timeout) or is unknown."""


def _configure(sock: zmq.asyncio.Socket, hwm: int, max_message_bytes: int) -> None:
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)


def make_keys(directory: Path) -> Path:
    """A server keypair and one client keypair for a run's roles (`flashq keys DIR`)."""
    directory = Path(directory)
    (directory / "clients").mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(directory, "server")
    zmq.auth.create_certificates(directory, "client")
    (directory / "client.key").rename(directory / "clients" / "client.key")
    for secret in directory.glob("*.key_secret"):
        secret.chmod(0o600)
    return directory


def _load(directory: Path, name: str) -> tuple[bytes, bytes | None]:
    path = Path(directory) / name
    if not path.exists():
        raise FileNotFoundError(f"CurveZMQ key {path} is missing (make the directory with `flashq keys DIR`)")
    return zmq.auth.load_certificate(path)


class _Codec:
    def __init__(self, max_message_bytes: int) -> None:
        self.encoder = Encoder()
        self.decoder = Decoder(max_message_bytes)
        self.rejected: Counter[str] = Counter()
        # a bundle must stay under the receiver's limit (ZeroMQ drops the peer past it)
        self.bundle_bytes = min(BUNDLE_BYTES, max_message_bytes - BUNDLE_HEADER_BYTES)

    def fits(self, count: int, size: int, nbytes: int) -> bool:
        """Whether a message of `nbytes` may join a bundle of `count` messages and `size` bytes."""
        return count < MAX_BUNDLE and size + nbytes <= self.bundle_bytes

    def decode_all(self, peer: str, frames: list) -> list[Message]:
        """Every valid message in one received ZeroMQ message; the rest are counted."""
        try:
            parts = unpack(frames)
        except RejectedFrame as e:
            self.reject(peer, e)
            return []
        out = []
        for part in parts:
            try:
                out.append(self.decoder.decode(part))
            except RejectedFrame as e:
                self.reject(peer, e)
            except Exception as e:  # a decoder bug must not end the receive loop: count it like a bad frame
                self.reject(peer, RejectedFrame(f"decoder error: {type(e).__name__}: {e}"))
        return out

    def reject(self, peer: str, err: RejectedFrame) -> None:
        self.rejected[_reason_key(err.reason, self.rejected)] += 1
        count = sum(self.rejected.values())
        if count <= 20 or count % 1000 == 0:
            log.warning("rejected frame from %s (%d so far): %s", peer or "?", count, err.reason)


HANDSHAKE_REFUSED = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "not this name's token (is it this run's? `flashq token ROLE --run-dir DIR`)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "no credential, or another mechanism (CurveZMQ on one side only?)",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the handshake failed",
}
HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL \
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
MAX_REJECT_KEYS = 64
MAX_PEERS_SEEN = 4096  # identities are the peer's choice: a flood of new ones must not grow the map


def _reason_key(reason: str, counted: Counter[str]) -> str:
    """What a rejection is counted under: its reason up to the first colon with numbers blanked,
    so "schema version 7" and "schema version 8" share a key, and at most `MAX_REJECT_KEYS`
    keys, so a peer inventing reasons cannot grow the map."""
    key = re.sub(r"\d+", "N", reason.split(":")[0][:80])
    return key if key in counted or len(counted) < MAX_REJECT_KEYS - 1 else "other"


def _peer_name(raw: bytes) -> str:
    """A link's identity is its role's name, '#', and a random suffix; anything unprintable (a
    stray socket) is shown in hex."""
    try:
        name = raw.decode()
        if name.isprintable():
            return name.split("#", 1)[0]
    except UnicodeDecodeError:
        pass
    return "0x" + raw.hex()


class Hub:
    """The coordinator's ROUTER: receives from and sends to named peers."""

    def __init__(self, address: str, *, hwm: int = 1000, max_message_bytes: int = 1 << 30, curve_keys: Path | None = None,
                 credentials=None):
        """`credentials`: what checks a name's token (`RunCredentials`); None hears any connection
        under the name it claims, the last to send being the one sent to (tests, benchmarks).
        `takeover(name)`: whether a newer connection proving a name already routed elsewhere may
        take it (the coordinator allows it for restartable workers); by default always."""
        self.ctx = zmq.asyncio.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.hwm = hwm
        _configure(self.sock, hwm, max_message_bytes)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.credentials = credentials
        self.takeover = lambda name: True
        self.routes: dict[str, bytes] = {}  # name -> the connection it is sent to (the last to prove it)
        self.auth = None
        if curve_keys is not None:
            public, secret = _load(curve_keys, "server.key_secret")
            self.auth = AsyncioAuthenticator(self.ctx)
            self.auth.start()
            self.auth.configure_curve(domain="*", location=str(Path(curve_keys) / "clients"))
            self.sock.curve_server = True
            self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
        elif credentials is not None:
            self.auth = _RoleAuthenticator(self.ctx, credentials)
            self.auth.start()
            self.sock.plain_server = True
        try:
            self.sock.bind(address)
        except zmq.ZMQError:
            self.close()  # the authenticator's endpoint too: one per context, the next hub binds it
            raise
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.codec = _Codec(max_message_bytes)
        self.last_seen: dict[str, float] = {}
        self.inbox: deque[tuple[str, Message]] = deque()

    async def send(self, peer: str, msg: Message) -> None:
        """Queue `msg` for `peer` without waiting: a peer whose queue is full (it has stopped
        reading, with `hwm` messages waiting) is lost, since waiting for it would stop the
        coordinator talking to everyone else, and a peer that waits to send to the coordinator
        in turn would never be read again."""
        await self.send_all(peer, [msg])

    async def send_all(self, peer: str, msgs: list[Message]) -> None:
        """`send` for several messages to one peer, in order, as few ZeroMQ messages as bundles allow."""
        bundle, size = [], 0
        for msg in msgs:
            frames = self.codec.encoder.encode(msg)
            n = bundled_nbytes(frames)
            if bundle and not self.codec.fits(len(bundle), size, n):
                await self._send_frame(peer, pack(bundle))
                bundle, size = [], 0
            bundle.append(frames)
            size += n
        if bundle:
            await self._send_frame(peer, pack(bundle))

    async def _send_frame(self, peer: str, frame) -> None:
        route = self.routes.get(peer)
        if route is None:
            raise PeerLost(f"{peer} is not connected")
        try:
            await self.sock.send_multipart([route, frame], copy=False, flags=zmq.DONTWAIT)
        except zmq.Again:
            raise PeerLost(f"{peer} is not reading: its queue of {self.hwm} messages is full") from None
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                raise PeerLost(f"{peer} is not connected") from None
            raise

    async def recv(self) -> tuple[str, Message]:
        """Next valid message; invalid frames are counted and skipped."""
        while not self.inbox:
            self._take(await self.sock.recv_multipart(copy=False))
        return self.inbox.popleft()

    async def recv_ready(self, max_reads: int = 16) -> tuple[str, Message] | None:
        """The next message already here, without waiting: one left from a bundle, or one the
        socket holds (reading at most `max_reads` ZeroMQ messages); None when there is none."""
        for _ in range(max_reads):
            if self.inbox:
                break
            try:
                self._take(await self.sock.recv_multipart(copy=False, flags=zmq.NOBLOCK))
            except zmq.Again:
                return None
        return self.inbox.popleft() if self.inbox else None

    def _take(self, message: list) -> None:
        """One received ZeroMQ message: its valid messages from a connection that proved its name
        join the inbox, and that name is seen now."""
        ident, *frames = message
        route = bytes(ident.buffer)
        peer = _peer_name(route)
        admitted = []
        for m in self.codec.decode_all(peer, frames):
            try:
                if self._admit(peer, route, m, frames):
                    admitted.append(m)
            except Exception as e:  # a check that breaks on a hostile message refuses it, and the loop goes on
                self.codec.reject(peer, RejectedFrame(f"admission error: {type(e).__name__}: {e}"))
        if not admitted:
            return
        self.last_seen.pop(peer, None)  # re-inserted last: the map runs from least to most recently seen
        self.last_seen[peer] = time.monotonic()
        if len(self.last_seen) > MAX_PEERS_SEEN:
            del self.last_seen[next(iter(self.last_seen))]
        self.inbox.extend((peer, m) for m in admitted)

    def _admit(self, peer: str, route: bytes, msg: Message, frames: list) -> bool:
        """Whether `msg` is heard: from the connection `peer` is routed to, or a hello proving the
        name (which routes it here) on a connection whose handshake proved the same name. Without
        credentials the last connection to send under a name is it."""
        if self.routes.get(peer) == route:
            return True
        token_ok = isinstance(msg, Hello) and self.credentials is not None and self.credentials.verify(peer, msg.token)
        proven = token_ok and self._handshake_proved(peer, frames)
        if proven and peer in self.routes and not self.takeover(peer):
            self.codec.reject(peer, RejectedFrame(f"a second connection proving a name that cannot restart: {peer}"))
            return False
        if self.credentials is None or proven:
            self.routes.pop(peer, None)
            self.routes[peer] = route
            if len(self.routes) > MAX_PEERS_SEEN:
                del self.routes[next(iter(self.routes))]
            return True
        if token_ok:
            why = "hello on a connection whose handshake proved another name"
        else:
            why = "hello with a wrong credential" if isinstance(msg, Hello) else "from a connection that has not proven its name"
        self.codec.reject(peer, RejectedFrame(f"{why}: {type(msg).__name__} as {peer}"))
        return False

    def _handshake_proved(self, peer: str, frames: list) -> bool:
        """Under PLAIN the handshake's user name is the name whose token it gave: it must be the
        name this connection speaks as (holding reward-2's token, a connection named trainer
        passes the handshake as reward-2, and no further)."""
        if not isinstance(self.auth, _RoleAuthenticator):
            return True
        return frames[-1].get("User-Id") == peer

    @property
    def rejected(self) -> Counter[str]:
        return self.codec.rejected

    @property
    def handshakes_refused(self) -> int:
        """Connections refused at the handshake for a token that is not their name's. (A peer with
        no credential at all fails earlier, on the mechanism, and is not counted; a refused
        connection is not tried again by libzmq.)"""
        return self.auth.refused if isinstance(self.auth, _RoleAuthenticator) else 0

    def silent_peers(self, peers: list[str], timeout_s: float) -> list[str]:
        now = time.monotonic()
        return [p for p in peers if now - self.last_seen.get(p, now) > timeout_s]

    def close(self) -> None:
        self.sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()


class _RoleAuthenticator(AsyncioAuthenticator):
    """The hub's ZAP handler under PLAIN: the user name is a role's name, the password its token."""

    def __init__(self, ctx: zmq.asyncio.Context, credentials) -> None:
        super().__init__(ctx)
        self.credentials = credentials
        self.refused = 0

    def _authenticate_plain(self, domain: str, username: str, password: str) -> tuple[bool, bytes]:
        if self.credentials.verify(username, password):
            return True, b"OK"
        self.refused += 1
        if self.refused <= 3 or self.refused % 1000 == 0:
            log.warning("refused a connection at its handshake (%d so far): no token for the name %r", self.refused, username[:64])
        return False, b"not this name's token"


class Link:
    """A role's DEALER connection to the coordinator."""

    def __init__(self, address: str, identity: str, *, hwm: int = 1000, max_message_bytes: int = 1 << 30,
                 curve_keys: Path | None = None, token: str = ""):
        """`token`: the role's credential, given at the handshake (PLAIN) when there is no CurveZMQ;
        a hub with credentials takes no connection without one."""
        self.ctx = zmq.asyncio.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        _configure(self.sock, hwm, max_message_bytes)
        self.sock.setsockopt(zmq.IDENTITY, f"{identity}#{secrets.token_hex(4)}".encode())  # its own, even beside a stale one
        if curve_keys is not None:
            self.sock.curve_serverkey = _load(curve_keys, "server.key")[0]
            self.sock.curve_publickey, self.sock.curve_secretkey = _load(curve_keys, "client.key_secret")
        elif token:
            self.sock.plain_username, self.sock.plain_password = identity.encode(), token.encode()
        self._monitor = self.sock.get_monitor_socket(HANDSHAKE_EVENTS)  # before connecting: no event is missed
        self.sock.connect(address)
        self.identity = identity
        self.codec = _Codec(max_message_bytes)
        self.last_seen = time.monotonic()
        self.inbox: deque[Message] = deque()
        self._bundle: list | None = None  # [messages, the future their send completes, bytes] while one forms

    async def send(self, msg: Message) -> None:
        """Send `msg`, bundled with whatever else this link sends in the same turn of the event
        loop. The first sender of a turn yields once, then sends them all; every sender returns
        once its bundle is on the socket (or raises what the send raised), so backpressure
        reaches them all."""
        frames = self.codec.encoder.encode(msg)
        n = bundled_nbytes(frames)
        open_bundle = self._bundle
        if open_bundle is not None and self.codec.fits(len(open_bundle[0]), open_bundle[2], n):
            open_bundle[0].append(frames)
            open_bundle[2] += n
            await asyncio.shield(open_bundle[1])
            return
        messages, sent = [frames], asyncio.get_running_loop().create_future()
        self._bundle = [messages, sent, n]
        try:
            await asyncio.sleep(0)
            self._close_bundle(sent)
            await self.sock.send(pack(messages), copy=False)
        except BaseException as e:
            self._close_bundle(sent)
            if len(messages) > 1:  # the others wait on this send: tell them why it did not happen
                sent.set_exception(PeerLost(f"{self.identity}: the send carrying {len(messages)} messages failed: {e!r}"))
            else:
                sent.cancel()
            raise
        sent.set_result(None)

    def _close_bundle(self, sent: asyncio.Future) -> None:
        if self._bundle is not None and self._bundle[1] is sent:
            self._bundle = None

    async def handshake(self, timeout_s: float) -> None:
        """Until the coordinator has taken this connection. A refused one is never tried again by
        libzmq and anything sent on it would wait for ever: say why instead."""
        from zmq.utils.monitor import recv_monitor_message

        if self._monitor is None:
            return
        try:
            while True:
                event = (await asyncio.wait_for(recv_monitor_message(self._monitor), timeout_s))["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return
                if event in HANDSHAKE_REFUSED:
                    raise PeerLost(f"{self.identity}: the coordinator refused this connection at its handshake: "
                                   f"{HANDSHAKE_REFUSED[event]}")
        except asyncio.TimeoutError:
            raise PeerLost(f"{self.identity}: no coordinator took this connection within {timeout_s:.0f}s") from None
        finally:
            self._stop_monitor()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    async def recv(self) -> Message:
        while not self.inbox:
            frames = await self.sock.recv_multipart(copy=False)
            self.last_seen = time.monotonic()
            self.inbox.extend(self.codec.decode_all("coordinator", frames))
        return self.inbox.popleft()

    async def recv_within(self, timeout_s: float, waiting_for: str) -> Message:
        try:
            return await asyncio.wait_for(self.recv(), timeout_s)
        except asyncio.TimeoutError:
            raise PeerLost(f"{self.identity}: no {waiting_for} from the coordinator within {timeout_s:.0f}s") from None

    @property
    def rejected(self) -> Counter[str]:
        return self.codec.rejected

    def silent_for(self) -> float:
        return time.monotonic() - self.last_seen

    def close(self) -> None:
        self._stop_monitor()
        self.sock.close(linger=0)
