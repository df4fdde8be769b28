"""Per-role credentials: a run secret, and from it one token per role name.

Anything that reaches the coordinator's socket could claim any role's name: stop the run with a
`Fatal`, take a reward worker's place and its samples, point the engines at its own weight
rendezvous. So each run has a secret (`credentials.key` in the run directory, readable by its
owner alone, made once and kept across resumes), and each role is given only its own token,
HMAC-SHA256(secret, name): the launcher puts it in the role's environment (`FLASHQ_ROLE_TOKEN`),
`flashq token ROLE --run-dir DIR` prints it for a role started by hand on another host. A role
proves its name with the token in its `Hello`; the hub then routes that name to that connection
alone and refuses everything else sent under the name (transport.Hub). A token names one role:
holding reward-2's does not make anyone the trainer. Tokens travel in the clear on the wire;
between hosts, CurveZMQ (`transport.curve_keys`) encrypts them with everything else.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from flashq.jsonl import fsync_path

FILE = "credentials.key"
TOKEN_ENV = "FLASHQ_ROLE_TOKEN"
TOKEN_CHARS = 32


class RunCredentials:
    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("a run secret of at least 16 bytes is needed")
        self._secret = secret

    @classmethod
    def ensure(cls, run_dir: Path) -> RunCredentials:
        """The run's credentials, made on first use (an owner-only file, fsynced). A file left
        empty by a crash while it was made is made again: no role can have been given a token."""
        path = Path(run_dir) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size == 0:
            path.unlink()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made before (a resume, a restarted coordinator, a concurrent first use)
            return cls.load(run_dir)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_path(path.parent)  # the new file's entry too, or a power loss may forget the file
        return cls.load(run_dir)

    @classmethod
    def load(cls, run_dir: Path) -> RunCredentials:
        path = Path(run_dir) / FILE
        try:
            return cls(bytes.fromhex(path.read_text().strip()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no credentials for this run (the launcher makes them at its start)") from None
        except ValueError as e:
            raise ValueError(f"{path}: not a run secret ({e})") from None

    def token(self, role: str) -> str:
        return hmac.new(self._secret, role.encode(), hashlib.sha256).hexdigest()[:TOKEN_CHARS]

    def verify(self, role: str, token: object) -> bool:
        """Whether `token` is `role`'s. Anything a peer sends is compared as bytes: a str with
        non-ASCII characters would make `compare_digest` raise, and end the receive loop."""
        if not isinstance(token, str) or len(token) != TOKEN_CHARS:
            return False
        return hmac.compare_digest(self.token(role).encode(), token.encode("utf-8", "replace"))


_given: str | None = None


def own_token() -> str:
    """The token this process was given ('' when none: its hello will be refused). Taken out of
    the environment on first use, so the engines, environments and reward code it starts do
    not inherit it (a role calls this at its start)."""
    global _given
    if _given is None:
        _given = os.environ.pop(TOKEN_ENV, "")
    return _given
