import torch
from torch import nn

import layerscope

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
kinds = ("activation", "grad", "weight", "weight_grad", "update")
with layerscope.watch(
    model, optimizer=optimizer, every=5, kinds=kinds, run="runs/sql"
) as scope:
    for _ in range(60):
        inputs = torch.randn(32, 16)
        loss = (model(inputs) - inputs[:, :4]).pow(2).mean()  # learn to copy 4 features
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss, lr=optimizer.param_groups[0]["lr"])

run = layerscope.load("runs/sql")

# The largest output gradient of each layer, and the step it was at
print(run.sql("""
    select module, max(absmax) as absmax, arg_max(step, absmax) as at_step
    from stats where kind = 'grad' group by module order by module
"""))

# Update-to-weight ratio per weight over the run: a join of two kinds
print(run.sql("""
    select u.module, u.tensor, median(u.l2 / w.l2) as median_ratio, max(u.l2 / w.l2) as max_ratio
    from stats u join stats w using (step, phase, rank, module, tensor, call)
    where u.kind = 'update' and w.kind = 'weight' and u.tensor = 'weight'
    group by all order by 1
"""))

# The ReLUs' zero fraction next to the loss, every 20 steps
print(run.sql("""
    select s.step, s.module, round(s.zero_frac, 3) as zero_frac, round(l.value, 4) as loss
    from stats s join scalars l on l.step = s.step and l.name = 'loss'
    where s.module_type = 'ReLU' and s.kind = 'activation' and s.step % 20 = 0
    order by s.step, s.module
"""))
