"""The trainer's model and one RL update on a `TrainBatch`.

A batch arrives as flat arrays (see `protocol.TrainBatch`); here it becomes padded
[sequences, tokens] tensors (laid out by `micro_batches`), logprobs of the sampled tokens under
the current policy, group advantages, and the configured loss (`algos.losses`). One batch is one
policy version: it may take several optimizer steps (`trainer.minibatches`), after which the
weights are broadcast once.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np
import torch

from flashq.algos.losses import Normalizer, policy_loss
from flashq.algos.overlong import filtered_loss_mask
from flashq.config import FlashqConfig
from flashq.trainer import parallel
from flashq.trainer.batch_stats import per_sample, sequence_advantages, staleness_stats, trained_lengths, zero_variance_groups
from flashq.trainer.logprobs import install_logprob_head, token_logprobs
from flashq.trainer.lr_schedule import lr_factor
from flashq.trainer.micro_batches import MicroBatch, MicroBatching
from flashq.trainer.packing import check_isolation, unpack
from flashq.trainer.shared_prompts import check_sharing, shared_token_logprobs, unsupported
from flashq.trainer.update_fence import UpdateFence
from flashq.wire.protocol import TrainBatch

log = logging.getLogger(__name__)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device is 'cuda' but no CUDA device is visible")
    return torch.device(requested)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_causal_lm(path, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


def stop_token_ids(path) -> list[int]:
    """The ids vLLM's `min_tokens` masks: the tokenizer's EOS and the generation config's."""
    from transformers import AutoTokenizer, GenerationConfig

    ids = set()
    eos = AutoTokenizer.from_pretrained(str(path)).eos_token_id
    if eos is not None:
        ids.add(int(eos))
    try:
        gen = GenerationConfig.from_pretrained(str(path)).eos_token_id
    except OSError:  # no generation_config.json
        gen = None
    ids.update([gen] if isinstance(gen, int) else gen or [])
    return sorted(ids)


class Learner(MicroBatching):
    def __init__(self, cfg: FlashqConfig, model_path: Path | str, reference_path: Path | str | None = None):
        """`reference_path`: the KL reference when it is not `model_path` (a resumed run keeps
        the base model as its reference)."""
        self.cfg = cfg
        tc = cfg.trainer
        self.device = pick_device(tc.device)
        self.ranks = parallel.init_distributed(tc, self.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.ranks.local_rank)
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed)
        # float32 masters and optimizer state; the forward and backward run in compute_dtype
        # (FSDP2's mixed-precision policy when sharded, autocast on one device)
        self.param_dtype, self.compute_dtype = DTYPES[tc.param_dtype], DTYPES[tc.compute_dtype]
        if tc.lora is not None:
            self.model = self._lora_model(model_path, reference_path)
        else:
            self.model = self._policy_model(model_path)
        self.model.train()
        if tc.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.reference = None
        if tc.loss.kl_coef > 0 and tc.lora is None:  # with LoRA the reference is the base: the adapter switched off
            self.reference = self._policy_model(reference_path or model_path).eval().requires_grad_(False)
        trained = [p for p in self.model.parameters() if p.requires_grad]
        # fused on a GPU: one kernel for the whole update and no full-size temporaries (foreach's
        # build one the size of the parameters: 30 GB at 7B in float32)
        self.optimizer = torch.optim.AdamW(decay_groups(trained, tc.weight_decay, tc.weight_decay_scope), lr=tc.lr,
                                           fused=self.device.type == "cuda" or None)
        self.version = 0
        self.updated = UpdateFence(self.device)  # a push waits on it: the step's updates are on the device
        self.nonfinite_in_row = 0  # batches skipped for a non-finite gradient since one was applied
        self.temperature = cfg.sampling.temperature or 1.0
        # forced lengths set min_tokens: vLLM masks the stop tokens before its logprobs, and so must we
        self.banned = None
        if cfg.sampling.forced_lengths is not None:
            self.banned = torch.tensor(stop_token_ids(model_path), dtype=torch.long, device=self.device)
        if tc.packing:
            self._check_packing()
        self.share_prompts = self._check_sharing()
        if self.ranks.sharded:  # FSDP2 leaves the root's parameters gathered after the checks' forwards
            self.model.reshard()
        # Dr. GRPO's constant: the most tokens one sample can train (an episode has several turns)
        self.max_sample_tokens = cfg.sampling.max_tokens * (cfg.env.max_turns if cfg.env is not None else 1)

    def _policy_model(self, path):
        """The model with flashq's logprob head; sharded with FSDP2 (before the optimizer, which
        must hold the sharded parameters) when the trainer has several ranks."""
        def prepare(model):
            install_logprob_head(model, self.cfg.trainer.logprob_chunk_tokens)

        if self.ranks.sharded:
            mp = (self.compute_dtype, self.param_dtype) if self.compute_dtype != self.param_dtype else None
            return parallel.load_sharded_model(path, self.param_dtype, self.device, self.ranks, prepare, mp)
        model = load_causal_lm(path, self.param_dtype, self.device)
        prepare(model)
        return model

    def _lora_model(self, model_path, reference_path):
        """The base frozen in the compute dtype (no float32 masters: it never changes) under
        adapters in the masters' dtype. A resumed run (`model_path` a checkpoint, not the base)
        reads its adapter from the checkpoint and the base from `reference_path`."""
        from flashq.trainer import lora

        resumed = reference_path is not None and Path(model_path) != Path(reference_path)
        base = load_causal_lm(reference_path if resumed else model_path, self.compute_dtype, self.device)
        install_logprob_head(base, self.cfg.trainer.logprob_chunk_tokens)
        adapter_dir = Path(model_path) / lora.ADAPTER_DIR if resumed else None
        return lora.wrap(base, self.cfg.trainer.lora, self.param_dtype, adapter_dir)

    def _reference_logprobs(self, micro: MicroBatch) -> torch.Tensor | None:
        if self.reference is not None:
            return self.logprobs(self.reference, micro)[0]
        if self.cfg.trainer.lora is not None and self.cfg.trainer.loss.kl_coef > 0:
            with self.model.disable_adapter():
                return self.logprobs(self.model, micro)[0]
        return None

    def _autocast(self):
        """Autocast on one device when computing below the masters' precision; FSDP2's policy
        does the casting on a sharded model."""
        enabled = self.compute_dtype != self.param_dtype and not self.ranks.sharded
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=enabled)

    def logprobs(self, model, micro: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs and entropies of a micro-batch's trained tokens under `model`, [S, T-1]."""
        with self._autocast():
            if micro.shared is not None:
                return shared_token_logprobs(model, micro.shared, micro.mask > 0, self.temperature, self.banned)
            p = micro.packed
            if p is None:
                return token_logprobs(model, micro.ids, micro.attn, self.temperature, micro.mask > 0, self.banned)
            logp, entropy = token_logprobs(model, p.ids, None, self.temperature, p.select, self.banned, p.positions)
            return unpack(logp, p.index), unpack(entropy, p.index)

    def _check_packing(self) -> None:
        """Packed rows are only right if the model's attention keeps each sequence to itself."""
        def logprobs(ids, attn, select, positions):
            return token_logprobs(self.model, ids, attn, 1.0, select, None, positions)[0]

        gap = check_isolation(self.model, logprobs, self.model.config.vocab_size, self.device)
        if gap > 1e-3:
            raise ValueError(
                f"trainer.packing: {type(self.model).__name__} lets packed sequences attend to each other (logprobs "
                f"differ by {gap:.3g} from the same sequences apart); set trainer.packing: false for this model"
            )

    def _check_sharing(self) -> bool:
        """Whether to share prompt passes (`trainer.share_prompts`): asked for, or by default
        where nothing rules it out and the model gives the same logprobs both ways."""
        tc = self.cfg.trainer
        if tc.share_prompts is False or (tc.share_prompts is None and (tc.gradient_checkpointing or tc.packing)):
            return False

        def logprobs(ids, attn):
            return token_logprobs(self.model, ids, attn, 1.0)[0]

        name = type(self.model).__name__
        # both layouts compute in compute_dtype: bfloat16 alone moves logprobs by about 1e-2
        tolerance = 1e-3 if self.compute_dtype == torch.float32 else 5e-2
        why = unsupported(self.model.config)
        gap = float("inf")
        if why is not None:
            why = f"{name}: {why}"
        else:
            self.model.eval()  # no dropout: the same function both ways
            try:
                with self._autocast():
                    gap = check_sharing(self.model, logprobs, self.model.config.vocab_size, self.device)
                why = f"{name} gives logprobs {gap:.3g} apart with shared prompt passes (tolerance {tolerance:g})"
            except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, KeyError) as e:  # e.g. a cache it cannot repeat
                why = f"{name} fails with shared prompt passes ({type(e).__name__}: {e})"[:400]
            finally:
                self.model.train()
        if gap <= tolerance:
            return True
        if tc.share_prompts:
            raise ValueError(f"trainer.share_prompts: {why}; set trainer.share_prompts: false for this model")
        log.info("not sharing prompt passes: %s", why)
        return False

    def learning_rate(self) -> float:
        """This version's rate: every minibatch of a batch steps at it; a resumed run continues
        the schedule from its saved version."""
        tc = self.cfg.trainer
        return tc.lr * lr_factor(self.version, tc.steps, tc.lr_schedule, tc.lr_warmup_steps, tc.lr_min_ratio)

    def train_step(self, batch: TrainBatch, before_update: Callable[[], None] | None = None) -> dict[str, float]:
        """One policy version. `before_update` runs once, after the first minibatch's gradients
        and before any parameter changes: the trainer role waits there for the previous weight
        push, which reads the parameters while this step computes its gradients."""
        if batch.batch_index != self.version:
            raise RuntimeError(f"batch {batch.batch_index} arrived at trainer version {self.version}")
        t0 = time.monotonic()
        tc, lc = self.cfg.trainer, self.cfg.trainer.loss
        n_seq = len(batch.request_ids)
        truncated = np.array([f == "length" for f in batch.finish_reasons], bool) if batch.finish_reasons else np.zeros(n_seq, bool)
        adv, shaped = sequence_advantages(batch, lc, self.max_sample_tokens)
        sampled_lens = resp_lens = trained_lengths(batch)  # the responses as sampled: the length metrics use these
        if lc.overlong == "filter" and truncated.any():
            batch = msgspec.structs.replace(batch, loss_mask=filtered_loss_mask(batch.loss_mask, batch.response_offsets, truncated))
            resp_lens = trained_lengths(batch)  # what the loss sees
        # per sample (a split episode's segments are one sample): rewards, lengths, truncation
        of = batch.sample_index()
        first = batch.sample_starts()
        n_samples = len(first)
        rewards = torch.from_numpy(np.array(batch.rewards)[first])
        sample_lens = per_sample(sampled_lens, of, n_samples)

        minibatches = self._minibatches(n_seq)
        plan = [self._rank_micro_batches(batch, mb, adv) for mb in minibatches]
        computed = sum(m.computed_tokens for mb in plan for m in mb)
        padding = 1.0 - sum(m.tokens for mb in plan for m in mb) / max(computed, 1)
        with torch.no_grad():
            for micro in (m for mb in plan for m in mb):
                if tc.minibatches > 1:  # later minibatches must see the policy as it was before the update
                    micro.prox = self.logprobs(self.model, micro)[0]
                micro.ref = self._reference_logprobs(micro)

        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        totals: dict[str, float] = {}
        losses, grad_norms = [], []
        skipped = False
        world = self.ranks.world_size
        read = None  # the statistics on the host, read while the device is idle (after the last gradient norm)
        for last, (mb, indices) in enumerate(zip(plan, minibatches), start=1 - len(plan)):
            # normalised over the whole minibatch on every rank; FSDP averages gradients over
            # ranks, so each rank's loss is scaled by the world size to make that a sum
            norm = Normalizer(
                tokens=float(resp_lens[indices].sum()),
                sequences=float(len(indices)),
                max_len=float(self.max_sample_tokens),
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for m in mb:
                logp, entropy = self.logprobs(self.model, m)
                loss, stats = policy_loss(
                    logp,
                    m.prox if m.prox is not None else logp.detach(),
                    m.behav,
                    m.adv[:, None].expand_as(logp),
                    m.mask,
                    norm,
                    policy=lc.policy,
                    correction=lc.correction,
                    is_cap=lc.is_cap,
                    eps_low=lc.clip_eps_low,
                    eps_high=lc.clip_eps_high,
                    dual_clip=lc.dual_clip,
                    aggregation=lc.aggregation,
                    ref_logp=m.ref,
                    kl_coef=lc.kl_coef,
                    mask_low=lc.mask_low,
                    mask_high=lc.mask_high,
                )
                (loss * world).backward()
                # the statistics are summed on the device and read back once, after the batch: a read
                # per statistic and micro-batch stalled a GPU ~19 times a pass (bench/gpu_check.py)
                with torch.no_grad():
                    loss_sum = loss_sum + loss.detach().double()
                    tokens = stats.pop("tokens")
                    stats["entropy"] = (entropy * m.mask).sum().double() / tokens.clamp(min=1)
                    # token-weighted over the whole batch: the shares of all minibatches add up to 1. A
                    # rank's padding micro-batch has no tokens; it adds zeros under the same names, so
                    # every rank sums the same keys
                    share = tokens.double() / max(float(resp_lens.sum()), 1.0)
                    for k, v in stats.items():
                        totals[k] = totals.get(k, 0.0) + torch.where(tokens > 0, v.double() * share, 0.0)
            grad_norm = parallel.scalar(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip))
            if not np.isfinite(grad_norm):
                # the rest of this batch is skipped, not retried: the same batch would give the same
                # gradient. The version still advances (batch b is trained at version b)
                self.optimizer.zero_grad(set_to_none=True)
                self.nonfinite_in_row += 1
                if self.nonfinite_in_row >= tc.max_nonfinite_in_row:
                    raise FloatingPointError(
                        f"non-finite gradient norm in {self.nonfinite_in_row} batches in a row (the last at version {self.version}); "
                        "lower trainer.lr or raise trainer.max_nonfinite_in_row"
                    )
                log.warning("non-finite gradient norm at version %d: batch %d skipped (%d in a row)",
                            self.version, batch.batch_index, self.nonfinite_in_row)
                skipped = True
                break
            losses.append(loss_sum)
            grad_norms.append(grad_norm)
            if last == 0:  # the gradient norm's read waited for the device: this one costs no wait, while
                # one after the optimizer step would wait for AdamW (and for nothing the push overlaps)
                read = to_host({**totals, **{f"_loss{i}": v for i, v in enumerate(losses)}})
            if before_update is not None:
                before_update()
                before_update = None
            self.optimizer.step()
        if not skipped:
            self.nonfinite_in_row = 0
        self.updated.mark()
        totals = read if read is not None else to_host({**totals, **{f"_loss{i}": v for i, v in enumerate(losses)}})
        losses = [totals.pop(f"_loss{i}") for i in range(len(losses))]
        totals = parallel.all_reduce_sum({**totals, "_loss": float(np.mean(losses)) if losses else 0.0}, self.ranks)
        self.version += 1
        return {
            "loss": totals.pop("_loss"),
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
            "train/lr": lr,
            "train/skipped_nonfinite": float(skipped),  # its optimizer step (or the rest of its minibatches) not applied
            "reward/mean": float(rewards.mean()) if n_seq else 0.0,
            "reward/std": float(rewards.std()) if n_samples > 1 else 0.0,
            "train/zero_variance_groups": float(zero_variance_groups(batch)),  # no advantage: dynamic sampling drops them
            "advantage/abs_mean": float(adv[first].abs().mean()) if n_seq else 0.0,
            "response/mean_tokens": float(sample_lens.mean()) if n_seq else 0.0,
            "response/max_tokens": float(sample_lens.max()) if n_seq else 0.0,
            "response/truncated_frac": float(truncated[first].mean()) if n_seq else 0.0,
            "reward/shaped_mean": float(shaped.mean()) if n_seq else 0.0,  # with the overlong penalty, if any
            **staleness_stats(batch, self.cfg.staleness_bound),
            "train/seconds": time.monotonic() - t0,
            "train/sequences": float(n_seq),
            "train/samples": float(n_samples),  # fewer than sequences when agent episodes were split into segments
            "train/tokens": float(resp_lens.sum()),
            "train/padding_frac": padding,  # of the tokens this rank's forward passes computed
            **{f"loss/{k}": v for k, v in totals.items()},
        }

    def save(self, directory: Path, tokenizer_source: Path | str) -> None:
        """The weights as a Hugging Face model (loadable by vLLM and transformers; the float32
        masters), the optimizer state through torch.distributed.checkpoint (each rank writes its
        shard; loadable at any world size), and the policy version and RNG state. With LoRA: the
        adapter (trainer/adapter) and, by `lora.save_merged`, the merged model in its place."""
        from transformers import AutoTokenizer

        model_state = parallel.full_model_state(self.model, self.ranks)
        if self.ranks.is_leader:  # the full weights were gathered to rank 0, which exports them
            directory.mkdir(parents=True, exist_ok=True)
            if self.cfg.trainer.lora is not None:
                from flashq.trainer import lora

                lora.save(self.model, directory, merged=self.cfg.trainer.lora.save_merged)
            else:
                self.model.save_pretrained(directory, state_dict=model_state)
            AutoTokenizer.from_pretrained(str(tokenizer_source)).save_pretrained(directory)
        parallel.save_optimizer(self.model, self.optimizer, directory / "optimizer")
        if self.ranks.is_leader:  # written last: checkpoint.py takes its presence as "complete"
            torch.save({"version": self.version, "torch_rng": torch.get_rng_state()}, directory / "trainer_state.pt")
        parallel.barrier(self.ranks)  # on every rank, a returned save is on disk

    def load_state(self, directory: Path) -> None:
        """After constructing from `directory` (the weights): optimizer, RNG and version. Every
        rank reads the checkpoint (on a filesystem all trainer hosts share)."""
        state = torch.load(directory / "trainer_state.pt", map_location="cpu", weights_only=False)
        if "optimizer" in state:  # written before the optimizer state was sharded: one full copy
            parallel.load_full_optimizer_state(self.model, self.optimizer, state["optimizer"], self.ranks)
        else:
            parallel.load_optimizer(self.model, self.optimizer, directory / "optimizer")
        torch.set_rng_state(state["torch_rng"])
        self.version = int(state["version"])


def to_host(values: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Device scalars as Python floats, read back in one transfer."""
    keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    read = torch.stack([values[k].double() for k in keys]).tolist() if keys else []
    return {**values, **dict(zip(keys, read))}


def decay_groups(params: list[torch.nn.Parameter], weight_decay: float, scope: str) -> list[dict]:
    """AdamW's parameter groups. At a strong decay its reach matters: shrinking a norm's gain
    shrinks what the layer passes on, so "matrices" leaves the 1-D parameters (biases, norm
    weights) undecayed; "all" decays every parameter alike."""
    if scope == "all":
        return [{"params": params, "weight_decay": weight_decay}]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
