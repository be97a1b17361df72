import torch
from torch import nn

import layerscope


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def is_block(name: str, module: nn.Module) -> bool:
    return isinstance(module, Block)


def watched(model: nn.Module, **selection: object) -> list[str]:
    with layerscope.watch(model, **selection) as scope:
        pass
    return [info.name for info in scope.modules if info.watched]


model = Model()
print(watched(model))
print(watched(model, include=is_block))  # a callable: each Block's own output
print(watched(model, include=[model.blocks[2], model.head]))  # module objects
print(watched(model, exclude=[model.blocks[0], lambda name, m: isinstance(m, nn.GELU)]))
print(watched(model, include=[is_block, r"^head$"], exclude=model.blocks[1]))

scope = layerscope.watch(model, include=[is_block, model.head, r"\.fc$"])
print(scope.config.to_dict()["include"])  # what run.json keeps
scope.close()
