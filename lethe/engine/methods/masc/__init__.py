"""MASC, everything that is its own (SPEC section 3): the objective, its parameters and presets, the margin
quantities, the online stop rule and the stop policy that trains until it fires, calibration of its targets, the
forget schedule, neighbours, the bound, content and destinations, memorisation gain, the model's own answers and
their replay."""
