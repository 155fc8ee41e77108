"""Unlearning methods: each module has one class with the same interface (see masc.Masc)."""
from worker.engine.methods.masc import Masc

METHODS = {Masc.name: Masc}
