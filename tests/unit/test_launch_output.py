"""What a flood of output must not do: the launcher reads every role's output to the end, however
long its lines (a role whose output stopped being read would block on its next write, silent to
every other role), and the coordinator counts refused messages under a bounded set of keys
(their reasons went into one log line at the end of the run)."""

import asyncio
import sys

from flashq.launch import LINE_LIMIT, LocalProcess
from flashq.roles.coordinator import rejection_kind
from flashq.wire.protocol import RewardResult


def test_a_line_longer_than_the_limit_comes_in_pieces_and_reading_goes_on():
    code = f"import sys; sys.stdout.write('x' * {3 * LINE_LIMIT + 5} + '\\n' + 'after\\n')"

    async def main():
        proc = await LocalProcess.start([sys.executable, "-c", code], {}, [])
        pieces = []
        while raw := await proc.readline():
            pieces.append(raw)
        await proc.proc.wait()
        return pieces

    pieces = asyncio.run(asyncio.wait_for(main(), 60))
    assert b"".join(pieces) == b"x" * (3 * LINE_LIMIT + 5) + b"\nafter\n"
    assert pieces[-1] == b"after\n" and len(pieces) > 2  # the long line in pieces, then the next whole


def test_refused_messages_are_counted_by_kind_not_by_id():
    kinds = {rejection_kind(f"reward-{i % 3}", RewardResult(f"g{i}/{i % 4}", 1.0),
                            KeyError(f"reward for g{i}/{i % 4} from reward-{i % 3} was not requested (or arrived twice)"))
             for i in range(1000)}
    assert kinds == {"RewardResult from reward: reward for # from # was not requested (or arrived twice)"}
