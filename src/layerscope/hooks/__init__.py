"""The training thread: hooks on the watched modules, the step clock, and parameter reads.

Receives the model, its optimizers and the watch's configuration. ``StepClock`` says which
step a forward, a backward or an optimizer step belongs to and whether that step records (the
``Schedule``); gates that torch.compile traces away keep the steps between free. On a recorded
step ``LayerHooks`` hands each activation, input and output gradient, and ``ParameterReads``
each weight, weight gradient and optimizer update, to the ``Recorder``
(``layerscope.recording``); on the others the gradients' sentinel reads only their extremes.
``alerts="raise"`` stops training here, at the step of the first non-finite value.
``NoiseScale`` (opt-in) estimates the gradient noise scale of recorded steps from their
micro-batches' gradients, as scalars of the step; ``AttentionWatch`` (opt-in) the entropy of
each attention head of recorded passes.
"""

from layerscope.hooks._attention import AttentionWatch
from layerscope.hooks._cost import CostMeter
from layerscope.hooks._grad_moment import GradientMoments
from layerscope.hooks._handles import HookHandles, ModuleClaims, in_backward
from layerscope.hooks._input_grads import InputGradients, hooked_inputs
from layerscope.hooks._layers import LayerHooks
from layerscope.hooks._noise_scale import NoiseScale
from layerscope.hooks._nonfinite_stop import nonfinite_error, stop_schedule
from layerscope.hooks._optimizers import parse_optimizers
from layerscope.hooks._parameters import ParameterReads, StepCall
from layerscope.hooks._stalled import stalled_parameters
from layerscope.hooks._steps import MicroBatchScalars, StepClock
from layerscope.hooks._values import InputNames, named_tensors

__all__ = [
    "AttentionWatch",
    "CostMeter",
    "GradientMoments",
    "HookHandles",
    "InputGradients",
    "InputNames",
    "LayerHooks",
    "MicroBatchScalars",
    "ModuleClaims",
    "NoiseScale",
    "ParameterReads",
    "StepCall",
    "StepClock",
    "hooked_inputs",
    "in_backward",
    "named_tensors",
    "nonfinite_error",
    "parse_optimizers",
    "stalled_parameters",
    "stop_schedule",
]
