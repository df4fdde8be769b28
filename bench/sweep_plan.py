"""What bench/all.py runs: each result file in bench/results/, the commands that make it in its
reporting mode and at reduced size, and the figures compared between runs.

Commands are argv lists after the interpreter, run in turn from the repository root; an entry's
commands all write one file (trainer_scale.json: bench/trainer_scale.py, then bench/scale_loop.py
adds the loop's figures). The order puts the cheap ones first. `minutes` are rough estimates read
from the result files' wall times and the scripts' docstrings; bench/all.py prefers what the last
sweep measured. Scripts with no result file of their own: bench/paper_sims.py (part of sim),
bench/scale_loop.py (part of trainer_scale), bench/repeat_task.py (vs_trl's job B),
bench/rogue.py (chaos), bench/sft_only.py (a calibration tool), bench/calculator_outcomes.py (a
diagnostic of the calculator examples), bench/figures.py (the docs' tables).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.15  # relative: a figure with no recorded spread moved when it changed by more


@dataclass(frozen=True)
class Bench:
    name: str  # bench/results/<name>.json
    full: tuple[tuple[str, ...], ...]  # the reporting commands
    quick: tuple[tuple[str, ...], ...]  # the same at reduced size
    figures: tuple[str, ...]  # compared before/after (nested figures as 'outer.inner')
    minutes: float  # full, a rough estimate
    quick_minutes: float
    needs: tuple[str, ...] = ()  # "cuda", modules that must be importable, or "result:NAME" (a calibration's file)
    tolerance: float = DEFAULT_TOLERANCE


def cmd(*argv: str) -> tuple[str, ...]:
    """One command of an entry that runs several."""
    return argv


def one(*argv: str) -> tuple[tuple[str, ...], ...]:
    """The commands of an entry that runs one."""
    return (argv,)


_BARE = ("trainer_tokens_per_s_vs_bare_hf", "trainer_tokens_per_s_vs_bare_hf_logits_everywhere",
         "trainer_tokens_per_s_vs_bare_hf_logits_to_keep")
_SHIPPED = [("gsm8k-qwen2.5-0.5b",), ("gsm8k-qwen2.5-1.5b-8gpu",), ("math-qwen2.5-1.5b-8gpu", "--median-len", "700")]

BENCHES = [
    Bench("queue", one("bench/transport.py", "--repeats", "5"), one("bench/transport.py", "--repeats", "1", "--seconds", "0.5"),
          ("transport_vs_raw_zmq", "transport_vs_raw_zmq_1k", "codec_msgspec_vs_msgpack_speedup"), 1, 0.3),
    Bench("fuzz", one("bench/fuzz.py"), one("bench/fuzz.py", "--frames", "20000"),
          ("fuzz_frames_rejected_without_crash", "rejection_rate_vs_valid"), 1, 0.3),
    Bench("specdec_replay", one("bench/specdec_replay.py"), one("bench/specdec_replay.py", "--prompts", "8"),
          ("replay_grouped_history_tokens_per_forward", "replay_grouped_other_prompts_epoch1_tokens_per_forward",
           "replay_grouped_vs_own_tokens_per_forward", "replay_grouped_mean_acceptance_length"), 5, 2),
    Bench("trainer_vs_bare", one("bench/trainer_vs_bare.py"), one("bench/trainer_vs_bare.py", "--reps", "2"), _BARE, 6, 3),
    Bench("trainer_vs_bare_2threads", one("bench/trainer_vs_bare.py", "--threads", "2", "--name", "trainer_vs_bare_2threads"),
          one("bench/trainer_vs_bare.py", "--threads", "2", "--name", "trainer_vs_bare_2threads", "--reps", "2"), _BARE, 4, 2),
    Bench("engine_wait", one("bench/engine_wait.py"), one("bench/engine_wait.py", "--runs", "1", "trainer.steps=3"),
          ("nap_tokens_per_s_vs_spin", "nap_makespan_vs_spin"), 6, 3),
    Bench("role_cpu", one("bench/role_cpu.py", "--steps", "600"), one("bench/role_cpu.py", "--steps", "150"),
          ("busy_share_of_cores", "share_outside_engine_and_trainer", "cpu_s_per_step_total"), 5, 2),
    Bench("chaos", one("bench/chaos.py"),
          one("bench/chaos.py", "--steps", "60", "--kills", "6", "--kills-sharded", "3", "--poison-steps", "30", "--fuzz-frames", "20000",
              "--impostor-answers", "10", "--flood-frames", "20000", "--flood-steps", "200", "--resumes", "4",
              "--torn-steps", "300"),
          ("samples_lost", "samples_duplicated", "poison_run_samples_lost", "kills_survived", "kills_survived_sharded",
           "throughput_vs_no_kills", "impersonation_attempts_accepted", "coordinator_rss_growth_mb"), 45, 8, tolerance=0.25),
    Bench("openai_agent", one("bench/openai_agent.py"), one("bench/openai_agent.py", "--steps", "30", "--rounds", "1"),
          ("episodes_per_s_vs_native_env", "reward_gain", "retokenized_tokens"), 18, 5),
    # lora.py has no flag that shortens its reward part (two whole quickstarts): quick runs the scale part only
    Bench("lora", one("bench/lora.py"), one("bench/lora.py", "--parts", "scale", "--steps", "3"),
          ("adapter_push_bytes_vs_full", "trainer_peak_memory_vs_full", "lora_reward_gain", "lora_wall_minutes"), 20, 4),
    Bench("async_rollout", one("bench/async_rollout.py"), one("bench/async_rollout.py", "--rounds", "1", "trainer.steps=10"),
          ("tokens_per_s_alpha2_vs_sync", "tokens_per_s_alpha1_vs_sync", "engine_idle_share_alpha2"), 20, 5),
    Bench("dynamic_sampling", one("bench/dynamic_sampling.py"), one("bench/dynamic_sampling.py", "--seeds", "0", "--steps", "150"),
          ("zero_variance_groups_trained", "staleness_violations", "reward_at_budget_with", "reward_at_budget_without"), 20, 4),
    # the recorded file's last command appended two sizes; the sweep measures every size, with that run's
    # memory-wait settings, then the loop at 0.5B
    Bench("trainer_scale",
          (cmd("bench/trainer_scale.py", "--start-free-gib", "16", "--wait-s", "60", "--retries", "1", "--contention-gib", "3"),
           cmd("bench/scale_loop.py")),
          (cmd("bench/trainer_scale.py", "--quick", "--out", "trainer_scale", "--gc-tokens"),
           cmd("bench/scale_loop.py", "--steps", "3", "--repeats", "1")),
          ("peak_memory_vs_naive", "tokens_per_s_vs_naive", "steps_at_0_5b", "weight_sync_vs_raw_broadcast"), 22, 6),
    Bench("longtail", one("bench/longtail.py", "--rounds", "3", "trainer.steps=6"),
          one("bench/longtail.py", "--rounds", "1", "--chunk", "128", "trainer.steps=4"),
          ("context_aware_tail_time_vs_fifo", "tail_time_vs_fifo", "makespan_vs_oracle", "makespan_vs_fifo"), 25, 8),
    Bench("agentic", one("bench/agentic.py"), one("bench/agentic.py", "--steps", "8", "--rounds", "1", "--learn-steps", "30"),
          ("episodes_per_s_alpha2_vs_sync", "episodes_per_s_alpha2_without_redundancy_vs_sync", "reward_trained_alpha2",
           "reward_trained_sync", "reward_gain"), 25, 6),
    # single engines vary by up to ~30% on a CPU (specdec.json's notes); the real-model workload trains its checkpoint
    # once (about 17 minutes on AMD, 50 on the Intel host) and runs about 3 minutes an engine, 8 more for the bound's
    # pairs (its figures, real_model_*grouped_tokens_per_s_vs_nospec, join the compared ones once the file has them)
    Bench("specdec", one("bench/specdec.py"),
          one("bench/specdec.py", "--prompts", "8", "--calibration-prompts", "4", "--drafts", "16", "--repeats", "1",
              "--bound-repeats", "1"),
          ("grouped_tokens_per_s_vs_nospec", "grouped_tokens_per_s_vs_vllm_suffix", "grouped_mean_acceptance_length",
           "epoch1_grouped_tokens_per_s_vs_vllm_suffix_at_256"), 200, 60, tolerance=0.3),
    # two seeds of three placements, 24 steps each: each run's first batch waits 2 to 17 minutes for a reward
    # signal (colocate.py's docstring); colocate's own s/step moved 24% between its two seeds
    Bench("colocate", one("bench/colocate.py"), one("bench/colocate.py", "--seeds", "0", "--steps", "6"),
          ("colocate_step_speed_vs_split", "colocate_step_speed_vs_turns", "colocate_final_reward"), 150, 45, tolerance=0.3),
    Bench("quickstart", one("bench/quickstart.py"), one("bench/quickstart.py", "--seeds", "0", "trainer.steps=600"),
          ("reward_gain", "eval_greedy_gain", "wall_minutes"), 42, 5),
    Bench("parity", one("bench/parity.py"), one("bench/parity.py", "--seeds", "0", "--steps", "200"),
          ("final_reward_alpha2", "final_reward_sync", "wall_ratio_alpha2_vs_sync"), 45, 5),
    Bench("real_model", one("bench/real_model.py"), one("bench/real_model.py", "--seeds", "0", "trainer.steps=20"),
          ("real_model_eval_greedy_gain", "real_model_wall_minutes"), 58, 9),
    # job R: TRL takes 39-51 s a step on the real model (Intel Xeon), three seeds of 40 steps beside flashq's
    # (about 50 minutes a seed for the pair); its runs are kept as each ends
    Bench("vs_trl", one("bench/vs_trl.py", "--seeds", "3"),
          one("bench/vs_trl.py", "--seeds", "1", "--steps-a", "300", "--steps-b", "60", "--steps-r", "10"),
          ("job_r_speed_vs_trl", "job_r_final_reward_gap_vs_trl", "job_r_push_pause_s", "job_a_speed_vs_trl", "job_b_speed_vs_trl",
           "job_b_speed_vs_trl_quickstart_settings"), 180, 20,
          needs=("trl", "result:vs_trl_calibration")),
    # a configuration's step time moved by up to 54% between repeats (sim.py's docstring)
    Bench("sim", one("bench/sim.py"), one("bench/sim.py", "--repeats", "1"),
          ("max_abs_error_vs_real_runs", "max_abs_error_held_out_runs", "max_abs_error_vs_paper_figures"), 90, 30, tolerance=0.5),
    # the sections' own limits add up to 840 s: the default --budget-s 450 fits a 15-minute device lease, not them all
    Bench("gpu_check", one("bench/gpu_check.py", "--budget-s", "900"),
          one("bench/gpu_check.py", "--sections", "ceiling", "step-1.5b", "race", "--budget-s", "300"),
          ("step_1_5b_s", "trainer_mfu_1_5b", "step_1_5b_peak_allocated_gib", "race_fenced_trials_stale", "step_7b_fits"),
          15, 5, needs=("cuda",)),
    Bench("trainer_gpu",
          (cmd("bench/trainer_gpu.py"),
           *(cmd("bench/trainer_gpu.py", "--shipped", f"configs/gpu/{c}.yaml", "--append", "--steps", "3", *extra)
             for c, *extra in _SHIPPED)),
          one("bench/trainer_gpu.py", "--settings", "config", "filled-16k", "--steps", "1"),
          ("config_step_s", "config_peak_allocated_gib", "filled_16k_peak_allocated_gib", "naive_16k_fits"), 30, 4, needs=("cuda",)),
]

# result files a sweep does not re-make, and why
SKIPPED = {
    "quickstart_calibration": "a calibration: chose the quickstart's settings (bench/sft_only.py and hand-run launches on "
                              "seeds never reported); redone when the settings are, never by a sweep",
    "real_model_calibration": "a calibration: seeds 1 and 2 chose configs/smollm2_arithmetic.yaml's settings "
                              "(bench/real_model.py --seeds 1 2 --name real_model_calibration); never re-run by a sweep",
    "real_model_overlong_none": "a calibration: seeds 1 and 2 with trainer.loss.overlong none, against filter "
                                "(docs/benchmarks/real_model.md, the overlong calibration); never re-run by a sweep",
    "real_model_overlong_filter": "a calibration: seeds 1 and 2 with trainer.loss.overlong filter, against none "
                                  "(docs/benchmarks/real_model.md, the overlong calibration); never re-run by a sweep",
    "vs_trl_curves": "written by the vs_trl entry beside vs_trl.json (the reward curves of its runs)",
    "vs_trl_calibration": "a calibration: job R's setting for each system, on seeds never reported "
                          "(bench/vs_trl.py --jobs r --calibrate); redone when the settings are, never by a sweep",
    "sweep": "this sweep's own report",
}
