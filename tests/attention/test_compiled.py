"""watch(attention=True) on a compiled model: recorded steps seen, one graph, no recompile."""

import logging

import pytest
import torch
from test_capture import BATCH, DIM, HEADS, LENGTH, Tiny

import layerscope


class _Recompiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().lstrip().startswith("Recompiling"):
            self.messages.append(record.getMessage())


@pytest.mark.slow
def test_a_compiled_model_records_attention_on_recorded_steps_without_recompiling():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="eager")  # dynamo's graphs, no inductor: fast
    recompiles = _Recompiles()
    torch._logging.set_logs(recompiles=True)
    logging.getLogger("torch._dynamo").addHandler(recompiles)
    torch._dynamo.utils.counters.clear()
    try:
        with layerscope.watch(compiled, optimizer, every=3, attention=True) as scope:
            for _ in range(7):
                compiled(torch.randn(BATCH, LENGTH, DIM)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
    finally:
        logging.getLogger("torch._dynamo").removeHandler(recompiles)
        torch._logging.set_logs()
    frame = scope.frame("attention")
    assert sorted(set(frame.step)) == [0, 3, 6]
    assert len(frame) == 3 * 2 * HEADS
    # Unrecorded steps run one graph, traced with torch's own attention and no hook of ours.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert recompiles.messages == []
    torch._dynamo.reset()
