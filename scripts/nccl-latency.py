# NCCL all-reduce latency on this host, as kiln's decode issues them: float32 rows in a
# CUDA graph, across two GPUs. Run on the GPU machine:
#   python3 -m torch.distributed.run --nproc_per_node 2 scripts/nccl-latency.py
import time, torch, torch.distributed as dist
dist.init_process_group("nccl")
r = dist.get_rank(); torch.cuda.set_device(r)
for H in (2048, 4096, 65536):
    x = torch.ones(H, device="cuda")
    for _ in range(20): dist.all_reduce(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(100): dist.all_reduce(x)
    g.replay(); torch.cuda.synchronize()
    t = time.time()
    for _ in range(20): g.replay()
    torch.cuda.synchronize()
    us = (time.time() - t) / 2000 * 1e6
    if r == 0: print(f"all_reduce f32 x{H} ({4*H} B) in a graph: {us:.1f} us", flush=True)
dist.destroy_process_group()
