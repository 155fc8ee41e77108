"""The model: loading any causal LM and the trainable model (LoRA or full), LoRA targets, precision, gradient
checkpointing, device maps and sharding, memory checks, generation, and the small fixture models of SPEC section 10."""
