"""The coordinator's logic without sockets (`core.Orchestrator`), with environment episodes
(`episodes`) and checkpoint state (`snapshot`) kept apart."""
