"""Tools on top of everything: the CLI, its JobManager client, the local supervisor, verify and the
reference runner, the demo and its event generator."""
