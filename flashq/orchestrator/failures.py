"""When a request keeps failing, or a batch keeps crashing the trainer: retry, then quarantine.

A request answered with an error is sent again; at its `rollout.max_request_failures`th failure
it is quarantined, and so are held groups named by batches that crashed the trainer. Nothing of a
quarantined request or group is trained; the ledger lists each with its reasons.

A part of `Orchestrator` (flashq.orchestrator.core), kept apart because a healthy run never
takes this path.
"""

from __future__ import annotations

import logging

from flashq.evaluation import is_eval
from flashq.wire.protocol import GenerateRequest

log = logging.getLogger("flashq.orchestrator")


class FailureEvents:
    def _on_failed_request(self, worker: str, request: GenerateRequest, reason: str) -> None:
        """A request answered with an error: send it again (its latest chunk), or, at its
        `rollout.max_request_failures`th failure, quarantine it: nothing of it is trained, and
        its group is dropped once its other samples are in (`rollout.on_poison: resample`, so
        another prompt takes its admission) or the run stops naming it (`fail`)."""
        rid, gid = request.request_id, request.group_id
        strikes = self.request_failures.setdefault(rid, [])
        strikes.append(f"{worker}: {reason}"[:300])
        self.ledger.requests_failed += 1
        rc = self.cfg.rollout
        if len(strikes) < rc.max_request_failures:
            log.warning("request %s failed on %s (%d of %d): %s", rid, worker, len(strikes), rc.max_request_failures, reason)
            self.ledger.requests_retried += 1
            self.gen_queue.submit(request)
            return
        del self.request_failures[rid]
        if rc.on_poison == "fail":
            raise RuntimeError(f"request {rid} failed {len(strikes)} times (rollout.max_request_failures) and rollout.on_poison "
                               f"is 'fail'; the last: {strikes[-1]}")
        log.error("request %s quarantined after %d failures; the last: %s", rid, len(strikes), strikes[-1])
        self.ledger.quarantined.append({"request_id": rid, "group_id": gid, "reasons": strikes})
        self.request_sent_at.pop(rid, None)
        self.divided.partial.pop(rid, None)
        if is_eval(rid):
            self.ledger.eval_requests_quarantined += 1
            record, prompt_done = self.evaluator.on_lost(rid)
            if prompt_done:
                self._generation_done(gid)
            self._file_eval(record)
            return
        self.ledger.requests_quarantined += 1
        group = self.buffer.groups[gid]
        group.fail("poison request", f"poison request {rid}: {strikes[-1]}")
        group.quarantined.add(rid)
        if group.generated:
            self._generation_done(gid)
        if group.complete:
            self._on_group_complete(group)

    def quarantine_groups(self, suspects: dict[str, list[str]]) -> None:
        """Held groups named by batches that crashed the trainer (`flashq/failed_batches.py`):
        listed in the ledger with their samples, and dropped once complete, as a poison
        request's group is."""
        for gid, errors in suspects.items():
            group = self.buffer.groups.get(gid)
            if group is None:
                continue
            log.error("group %s quarantined: in %d batches that crashed the trainer; the last: %s", gid, len(errors), errors[-1])
            self.ledger.quarantined.append({"group_id": gid, "request_ids": sorted(group.samples), "reasons": errors})
            self.ledger.groups_quarantined += 1
            group.fail("poison batch", f"in {len(errors)} batches that crashed the trainer; the last: {errors[-1]}")
            if group.complete:
                self._on_group_complete(group)
