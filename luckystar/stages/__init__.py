"""One module per `config.stage`, each the pure functions of its method plus a short `run(config, workdir)`.
Stages import the engine, tasks and core, never each other (`config.stage_module` finds one by name)."""
