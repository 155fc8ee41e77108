"""Training: one loop (loop.py) for every method, which differ only in their objective (worker.engine.methods)
and their stop policy: MASC's online rule (rule.py) or the field's fixed budget (budget.py). setup.py prepares a
run, result.py types what it hands back."""
