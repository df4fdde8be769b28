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

FILE = "credentials.key"
TOKEN_ENV = "FLASHQ_ROLE_TOKEN"


class RunCredentials:
    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("a run secret of at least 16 bytes is needed")
        self._secret = secret

    @classmethod
    def ensure(cls, run_dir: Path) -> RunCredentials:
        """The run's credentials, made on first use (owner-only file, written atomically)."""
        path = Path(run_dir) / FILE
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(tmp, path)  # a concurrent first use keeps the file that got there first
            except FileExistsError:
                pass
            tmp.unlink()
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
        return hmac.new(self._secret, role.encode(), hashlib.sha256).hexdigest()[:32]

    def verify(self, role: str, token: str) -> bool:
        return hmac.compare_digest(self.token(role), token)


def own_token() -> str:
    """The token this process was given ('' when none: its hello will be refused)."""
    return os.environ.get(TOKEN_ENV, "")
