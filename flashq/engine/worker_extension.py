"""Methods flashq adds to vLLM's worker (vLLM's `worker_extension_cls`), called by name through
`collective_rpc` so nothing but a string crosses vLLM's engine boundary."""

from __future__ import annotations


class FlashqWorkerExtension:
    def flashq_push_weights(self, update_info: dict, deadline_s: float | None = None) -> None:
        """vLLM's start_weight_update, update_weights and finish_weight_update in one call: one
        trip from the engine core to its workers per push instead of three, all while paused. On
        NCCL the receive has a deadline (`push_deadline`): past it the communicator is aborted
        and this raises, so the engine keeps its old version label and stays paused."""
        from flashq.engine import ipc_handles
        from flashq.engine.push_deadline import under_nccl_deadline

        self.start_weight_update()
        under_nccl_deadline(self.weight_transfer_engine, deadline_s, "weight receive", self.update_weights,
                            ipc_handles.decode(update_info))
        self.finish_weight_update()

    def flashq_stage_weights(self, update_info: dict, deadline_s: float | None = None) -> None:
        """Receive a push into memory beside the served model, on a thread of the engine core's
        process while the engine generates (`vllm_plugin.receive_in_engine_core`); the model is
        not touched until `flashq_load_staged`. A receive that fails leaves nothing staged."""
        from flashq.engine import adapter
        from flashq.engine.push_deadline import under_nccl_deadline

        self._flashq_staged = None
        self._flashq_staged = under_nccl_deadline(self.weight_transfer_engine, deadline_s, "weight receive", adapter.receive,
                                                  self, update_info)

    def flashq_load_staged(self) -> None:
        """Load what `flashq_stage_weights` received, with vLLM's layerwise reload as a push
        does; run while the engine is paused."""
        staged, self._flashq_staged = getattr(self, "_flashq_staged", None), None
        if staged is None:
            raise RuntimeError("no received weights to load: the receive did not complete")
        self.start_weight_update()
        try:
            self.weight_transfer_engine.model.load_weights(list(staged.items()))
        except BaseException:
            self._weight_update_active = False
            self.weight_transfer_engine.reset_weight_update_target()
            raise
        self.finish_weight_update()

    def flashq_push_adapter(self, update_info: dict, peft_config: dict, merged: bool, deadline_s: float | None = None) -> None:
        """A LoRA push: receive the adapter's tensors and serve them in place of the last ones,
        merged into the base weights or as vLLM's LoRA adapter."""
        from flashq.engine import adapter
        from flashq.engine.push_deadline import under_nccl_deadline

        tensors = under_nccl_deadline(self.weight_transfer_engine, deadline_s, "adapter receive", adapter.receive, self, update_info)
        (adapter.merge if merged else adapter.install)(self, tensors, peft_config)

    def flashq_abandon_weight_update(self) -> None:
        """Forget a weight update whose push broke off (a rollout worker died mid-way), so the
        next one can start. Layers it had not reloaded stay staged and the next push reloads
        every layer; generation stays paused until then."""
        if getattr(self, "_weight_update_active", False):
            self._weight_update_active = False
            self.weight_transfer_engine.reset_weight_update_target()

    def flashq_parameter(self, name: str) -> tuple[str, list[float]]:
        """A served parameter's dtype and values (as float32), to check what a push delivered."""
        param = dict(self.model_runner.model.named_parameters())[name]
        return str(param.dtype), param.detach().float().cpu().flatten().tolist()
