"""Mode connectivity between two versions (SPEC section 6): paths, the Bezier fit, curve evaluation,
barriers, the suppress-first analysis and the MCU ensemble. Pure torch/transformers."""
