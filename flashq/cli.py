"""The `flashq` command.

  flashq launch FILE [key=value ...] [--dry-run]   start every role of a run on this machine
  flashq sft FILE [key=value ...]                   supervised warm start; prints the checkpoint
  flashq fetch MODEL|FILE [key=value ...]           fetch or convert a model once; prints its folder
  flashq role NAME --config FILE --connect ADDR     start one role (what a multi-host run uses)
  flashq sim FILE [key=value ...] --grid K=A,B      predict step time and throughput (flashq/sim/simulator.py)
  flashq reference [--check]                        write docs/reference/ (every config key, every command) from the code
  flashq --version

Heavy modules (torch, vLLM) are imported only by the role that needs them, after parsing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

from flashq.config import ConfigError, load_config, role_kind
from flashq.models.gguf import ModelSourceError


def version() -> str:
    """The installed distribution's version (a source tree run without installing has none)."""
    try:
        return importlib.metadata.version("flashq")
    except importlib.metadata.PackageNotFoundError:
        import flashq

        return getattr(flashq, "__version__", "unknown (not installed)")


def _parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`parser_class`: the subcommands' too (a test's raises where argparse would exit)."""
    p = parser_class(prog="flashq", description="Fast asynchronous RL post-training on vLLM.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", required=True)

    launch = sub.add_parser("launch", help="start all roles of a run (on this machine, or on a Ray cluster)")
    launch.add_argument("config", type=Path, help="YAML config (see configs/)")
    launch.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. async_ratio=2 trainer.steps=50")
    launch.add_argument("--dry-run", action="store_true", help="print each role's resolved config and command, start nothing")
    launch.add_argument("--no-progress", action="store_true", help="plain log lines instead of the live progress panel")
    launch.add_argument(
        "--backend", choices=["local", "ray"], default="local",
        help="local: every role a process on this machine; ray: every role a Ray actor on the cluster at ray.address",
    )
    launch.add_argument(
        "--external", action="append", default=[], metavar="ROLE",
        help="a role (e.g. reward-1) you start yourself, with the command printed for it (in a debugger, on another "
        "host); the launcher neither starts nor restarts it, and the run waits for it to connect",
    )
    launch.add_argument(
        "--resume", nargs="?", const="latest", metavar="RUN_DIR",
        help="continue a stopped run from its last checkpoint (default: the newest run of this config's name)",
    )

    sft = sub.add_parser("sft", help="supervised warm start on solved task examples; prints the checkpoint path")
    sft.add_argument("config", type=Path, help="YAML config (its sft section, model and task)")
    sft.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. sft.steps=100")

    fetch = sub.add_parser("fetch", help="fetch, build or convert a model once (a hub id, a built-in name, a .gguf file); prints its folder")
    fetch.add_argument("model", help="a model.name (hub id, smollm2-135m-instruct, file.gguf, tiny) or a YAML config naming one")
    fetch.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="with a config: config overrides")

    report = sub.add_parser("report", help="write report.png and summary.json for a run directory")
    report.add_argument("run_dir", type=Path, help="a run's directory (runs/NAME-TIMESTAMP)")

    samples = sub.add_parser("samples", help="print a run's latest scored responses with their rewards (log.samples_every)")
    samples.add_argument("run_dir", type=Path, help="a run's directory (runs/NAME-TIMESTAMP)")
    samples.add_argument("--count", type=int, default=5, help="how many, the latest")

    sim = sub.add_parser("sim", help="simulate a run: predicted step time and throughput over a grid of settings")
    sim.add_argument("config", type=Path, help="YAML config of the run to simulate")
    sim.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, applied before the grid")
    sim.add_argument("--grid", nargs="+", default=[], metavar="KEY=V1,V2", help="e.g. async_ratio=0,1,2 rollout.num_workers=2,4")
    sim.add_argument("--calibration", type=Path, metavar="FILE", help="constants fitted by --fit (default: built-in ones for a 2-core CPU)")
    sim.add_argument("--fit", type=Path, nargs="+", metavar="RUN_DIR", help="fit the constants from real runs into --calibration")

    keys = sub.add_parser("keys", help="make CurveZMQ keys for transport.curve_keys (copy the directory to every host)")
    keys.add_argument("directory", type=Path, help="a new (or empty) directory to make the keys in")

    token = sub.add_parser("token", help="print a role's credential, for a role started by hand (FLASHQ_ROLE_TOKEN)")
    token.add_argument("name", help="trainer | rollout-N | reward-N")
    token.add_argument("--run-dir", type=Path, required=True, metavar="DIR", help="the run's directory (holds credentials.key)")

    role = sub.add_parser("role", help="start one role of a run")
    role.add_argument("name", help="coordinator | trainer | rollout-N | reward-N")
    role.add_argument("--config", type=Path, required=True, metavar="FILE", help="the run's resolved config (<run_dir>/config.yaml)")
    role.add_argument("--connect", required=True, metavar="ADDR", help="the coordinator's address, e.g. tcp://10.0.0.1:5555 (the coordinator binds it)")
    role.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")

    ref = sub.add_parser("reference", help="write the configuration and command-line reference pages from the code")
    ref.add_argument("--out", type=Path, default=Path("docs/reference"), metavar="DIR", help="where configuration.md and cli.md go")
    ref.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each page that is not what the code generates")
    return p


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The command line, with key=value overrides allowed after the options too."""
    parser = parser or _parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [x for x in extra if x.startswith("-") or "=" not in x]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if hasattr(args, "overrides"):
        args.overrides = list(args.overrides) + extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "launch":
            return _launch(args)
        if args.command == "sft":
            return _sft(args)
        if args.command == "sim":
            return _sim(args)
        if args.command == "fetch":
            return _fetch(args)
        if args.command == "reference":
            return _reference(args)
        if args.command == "keys":
            from flashq.wire.transport import make_keys

            if args.directory.exists() and any(args.directory.iterdir()):
                raise ConfigError(f"{args.directory} is not empty; keys are made into a new directory")
            print(f"CurveZMQ keys in {make_keys(args.directory)}; set transport.curve_keys to it on every host")
            return 0
        if args.command == "token":
            from flashq.credentials import RunCredentials

            try:
                print(RunCredentials.load(args.run_dir).token(args.name))
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(str(e)) from None
            return 0
        if args.command == "report":
            from flashq.reporting.report import write_report

            png, text = write_report(args.run_dir)
            print(f"{text}\nplot: {png}")
            return 0
        if args.command == "samples":
            from flashq.reporting.samples import print_samples

            if not args.run_dir.is_dir():
                raise ConfigError(f"{args.run_dir}: no such run directory")
            return print_samples(args.run_dir, args.count)
        return _role(args)
    except (ConfigError, ModelSourceError) as e:
        print(f"flashq: {e}", file=sys.stderr)
        return 2


def _launch(args) -> int:
    from flashq.launch import Launcher, dry_run, refuse_used_run_dir, resolve_run
    from flashq.resume import resume_config

    cfg = load_config(args.config, args.overrides)
    if args.resume:
        cfg = resume_config(cfg, args.resume, args.overrides)
    else:
        refuse_used_run_dir(cfg)
    cfg = resolve_run(cfg)
    if args.dry_run:
        print(dry_run(cfg))
        return 0
    unknown = sorted(set(args.external) - set(cfg.role_names()) | set(args.external) & {"coordinator", "trainer"})
    if unknown:
        raise ConfigError(f"--external {', '.join(unknown)}: not a rollout or reward role of this run ({', '.join(cfg.role_names())})")
    return Launcher(cfg, show_progress=False if args.no_progress else None, backend=args.backend, external=args.external).run()


def _sft(args) -> int:
    from flashq.roles.common import setup_logging
    from flashq.sft import run_sft

    cfg = load_config(args.config, args.overrides)
    setup_logging(cfg.log.level, cfg.log.vllm_level)
    print(run_sft(cfg))
    return 0


def _fetch(args) -> int:
    from flashq.config import ModelConfig
    from flashq.models.sources import describe, model_path

    is_config = args.model.endswith((".yaml", ".yml")) and Path(args.model).is_file()
    if args.overrides and not is_config:
        raise ConfigError("flashq fetch: key=value overrides go with a YAML config, not a model name")
    model = load_config(Path(args.model), args.overrides).model if is_config else ModelConfig(name=args.model)
    if about := describe(model):
        print(about, file=sys.stderr)
    print(model_path(model, fetch=True))
    return 0


def _reference(args) -> int:
    from flashq.reference import REFRESH, stale_pages, write_pages

    if args.check:
        stale = stale_pages(args.out, _parser())
        for path in stale:
            print(f"flashq: {path} is not what the code generates; run `{REFRESH}`", file=sys.stderr)
        return 1 if stale else 0
    for path in write_pages(args.out, _parser()):
        print(f"wrote {path}")
    return 0


def _sim(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from flashq.sim.calibration import Calibration
    from flashq.sim.simulator import sweep

    if args.fit:
        if not args.calibration:
            raise ConfigError("--fit needs --calibration FILE to write the fitted constants to")
        cal = Calibration.fit(args.fit)
        cal.save(args.calibration)
        print(f"calibration from {len(args.fit)} run(s) written to {args.calibration}")
    cal = Calibration.load(args.calibration) if args.calibration else Calibration()
    rows = sweep(args.config, args.overrides, args.grid, cal)
    table = Table(title=f"flashq sim {args.config} (predicted)")
    keys = list(rows[0]["settings"])
    for header in [*keys, "s/step", "tokens/s", "vs first", "engine idle", "rollout s", "tail s"]:
        table.add_column(header, justify="right")
    for r in rows:
        table.add_row(*[str(v) for v in r["settings"].values()], f"{r['step_s_mean']:.3f}", f"{r['tokens_per_s']:,.0f}",
                      f"{r['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x", f"{100 * r['engine_idle_share']:.0f}%",
                      f"{r['rollout_s_mean']:.2f}", f"{r['tail_s_mean']:.2f}")
    Console().print(table)
    return 0


def _role(args) -> int:
    from flashq.credentials import own_token
    from flashq.roles.common import run_role, setup_logging

    own_token()  # out of the environment before anything this role starts could inherit it
    role = args.name if "-" in args.name or args.name in ("coordinator", "trainer") else f"{args.name}-0"
    kind = role_kind(role)
    cfg = load_config(args.config, args.overrides)
    setup_logging(cfg.log.level, cfg.log.vllm_level)
    run_dir = cfg.log.run_dir or (cfg.log.root / cfg.name)
    if kind == "coordinator":
        from flashq.roles.coordinator import Coordinator

        proc = Coordinator(cfg, args.connect, run_dir)
        return run_role(role, proc.run, lambda: None)
    if kind == "rollout":
        from flashq.roles.rollout import RolloutWorker

        proc = RolloutWorker(cfg, role, args.connect)
    elif kind == "reward":
        from flashq.roles.reward import RewardWorker

        proc = RewardWorker(cfg, role, args.connect)
    else:
        from flashq.roles.trainer import TrainerRole

        proc = TrainerRole(cfg, role, args.connect, run_dir)
    return run_role(role, proc.run, lambda: proc.link)


if __name__ == "__main__":
    status = main()
    if sys.argv[1:2] == ["role"]:  # a role process: its work is done and its files are closed
        from flashq.roles.common import exit_without_teardown

        exit_without_teardown(status)
    sys.exit(status)
