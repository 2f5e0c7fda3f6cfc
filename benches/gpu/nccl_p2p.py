"""NCCL point-to-point reference, run in the same call as devcomm's LSA benchmark.

Two processes, one per GPU, through PyTorch's NCCL backend:
  * one-way bandwidth: rank 0 sends, rank 1 receives, sizes 1 KiB .. 1 GiB;
  * both directions at once (batch_isend_irecv), same sizes;
  * ping-pong round trip (send, then receive the reply), 8 B .. 64 KiB.
Times come from CUDA events over many iterations after warm-up; the median of
several repetitions is printed as CSV lines prefixed with "nccl,".
"""
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def timed(fn, iters, reps=7):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)  # microseconds per iteration
    return statistics.median(times)


def worker(rank, sizes, pp_sizes):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, init_method="tcp://127.0.0.1:29517")
    peer = 1 - rank
    big = torch.empty(max(sizes), dtype=torch.uint8, device="cuda").random_(0, 255)
    recv = torch.empty_like(big)

    def one_way(n):
        if rank == 0:
            dist.send(big[:n], peer)
        else:
            dist.recv(recv[:n], peer)

    def both_ways(n):
        ops = [dist.P2POp(dist.isend, big[:n], peer), dist.P2POp(dist.irecv, recv[:n], peer)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()

    def ping_pong(n):
        if rank == 0:
            dist.send(big[:n], peer)
            dist.recv(recv[:n], peer)
        else:
            dist.recv(recv[:n], peer)
            dist.send(big[:n], peer)

    for n in sizes:
        iters = 200 if n <= (1 << 20) else (20 if n <= (64 << 20) else 5)
        for _ in range(3):
            one_way(n)
        us1 = timed(lambda: one_way(n), iters)
        us2 = timed(lambda: both_ways(n), iters)
        if rank == 0:
            print(f"nccl,oneway,{n},{us1:.3f},{n / us1 / 1e3:.2f}", flush=True)
            print(f"nccl,bidir,{n},{us2:.3f},{n / us2 / 1e3:.2f}", flush=True)
    for n in pp_sizes:
        for _ in range(20):
            ping_pong(n)
        us = timed(lambda: ping_pong(n), 500)
        if rank == 0:
            print(f"nccl,pingpong,{n},{us:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sizes = [1 << k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB, every 4x
    pp_sizes = [8, 64, 512, 4096, 65536]
    if len(sys.argv) > 1 and sys.argv[1] == "--quick":
        sizes = [1 << 10, 1 << 20]
        pp_sizes = [8]
    mp.spawn(worker, args=(sizes, pp_sizes), nprocs=2)
