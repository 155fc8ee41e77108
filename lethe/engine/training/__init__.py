"""Training: one loop (loop.py) for every method, which differ only in their objective (lethe.engine.methods) and
their stop policy: MASC's (lethe.engine.methods.masc.stop_policy) or the field's fixed budget (budget.py). setup.py
prepares a run, result.py types what it hands back, runtime.py records where it ran."""
