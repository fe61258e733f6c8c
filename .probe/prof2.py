import torch, tritonkit as tk
from torch.profiler import profile, ProfilerActivity
x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
def step():
    y = tk.ops.rms_norm(x, w); y.backward(g)
for _ in range(10): step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(20): step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=50))
