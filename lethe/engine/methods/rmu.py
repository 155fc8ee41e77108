"""RMU (SPEC section 4): at layer l push forget hidden states toward c * u (u a fixed random unit vector),
keep retain hidden states at the reference's; only the MLP output projections of layers l-2..l learn."""
from __future__ import annotations

import torch

import lethe.engine.methods.objectives as O
from lethe.engine.contract.errors import EngineInputError
from lethe.engine.model.loading import module_inventory
from lethe.engine.model.lora_targets import mlp_output_projections


def rmu_layer(num_layers: int, requested: int) -> int:
    """The layer whose output is steered: as requested, else about a quarter of the depth."""
    if requested >= num_layers:
        raise EngineInputError(f"rmu_layer={requested}: the model has {num_layers} layers", field="rmu_layer")
    return requested if requested >= 0 else min(num_layers - 1, num_layers // 4)


def trainable_modules(model, params) -> list[str]:
    """The full names of the modules RMU updates: the MLP output projections of layers l-2..l, whatever the
    architecture calls them (down_proj, c_proj, fc2, dense_4h_to_h, ...)."""
    layer = rmu_layer(model.config.num_hidden_layers, params.rmu_layer)
    modules, shape = module_inventory(model)
    names = mlp_output_projections(modules, shape, model.config.hidden_size, range(max(0, layer - 2), layer + 1))
    if not names:
        raise EngineInputError(f"rmu: found no MLP output projection in layers {max(0, layer - 2)}..{layer} "
                               "(a mixture-of-experts model keeps them fused)", field="method")
    return names


class RMU:
    # Only the MLP output projections of layers l-2..l learn (lethe.engine.training.setup.build_trainable_model).
    trainable_modules = staticmethod(trainable_modules)

    def __init__(self, params, trainable, pad_id: int):
        self.params, self.trainable, self.pad_id = params, trainable, pad_id
        config = trainable.model.config
        self.layer = rmu_layer(config.num_hidden_layers, params.rmu_layer)
        generator = torch.Generator().manual_seed(params.seed)
        u = torch.rand(config.hidden_size, generator=generator)
        device = next(trainable.model.parameters()).device
        self.control = (params.rmu_c * u / u.norm()).to(device)

    def _hidden(self, batch, reference: bool = False):
        # hidden_states[0] is the embedding output, so layer l's output is index l + 1.
        outputs = self.trainable.reference_outputs(batch) if reference else self.trainable.outputs(batch)
        return outputs.hidden_states[self.layer + 1]

    def loss(self, forget, retain):
        p = self.params
        forget_hidden = self._hidden(forget)
        if retain is None:
            forget_term = O.masked_mse(forget_hidden, self.control.expand_as(forget_hidden),
                                       forget.attention_mask.float())
            return forget_term, {"forget": forget_term.item(), "total": forget_term.item()}
        total, forget_term, retain_term = O.rmu(
            forget_hidden, forget.attention_mask.float(), self.control, self._hidden(retain),
            self._hidden(retain, reference=True), retain.attention_mask.float(), p.retain_weight)
        return total, {"forget": forget_term.item(), "retain": retain_term.item(), "total": total.item()}
