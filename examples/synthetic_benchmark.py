"""Horovod's ``pytorch_synthetic_benchmark.py`` on disttrain's Horovod-style API.

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port 29513 examples/synthetic_benchmark.py --num-iters 5

Random inputs and labels of a fixed batch (no data loading), a small model
(disttrain's mlp or cnn instead of ResNet-50, so it runs on CPUs), forward,
backward and the averaged step timed in iterations of ``--num-batches-per-iter``
batches after ``--num-warmup-batches``; each iteration's samples/s is averaged
over the ranks with ``dt.allreduce`` of a Python number, as Horovod's script
does, and rank 0 prints the per-worker and total figures with their spread.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch
from torch.nn import functional as F

import disttrain as dt
from disttrain.models import cnn, mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--batch-size", type=int, default=32, help="per-worker batch")
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 on the wire")
    parser.add_argument("--algorithm", default="native")
    args = parser.parse_args()

    dt.init()  # torchrun's environment, or one process
    torch.manual_seed(0)
    model = mlp(64, 10, (256, 256)) if args.model == "mlp" else cnn(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * dt.size())
    opt = dt.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        algorithm=args.algorithm,
        compression="fp16" if args.fp16_allreduce else None,
    )
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(opt, root_rank=0)
    data = torch.randn(args.batch_size, 64)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    def log(text: str) -> None:
        if dt.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.model}, batch size: {args.batch_size}, workers: {dt.size()}")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        rate = dt.allreduce(rate, average=True)  # the mean over workers, on every rank
        log(f"Iter #{i}: {rate:.1f} samples/sec per worker")
        rates.append(rate)
    mean = statistics.mean(rates)
    spread = 1.96 * statistics.stdev(rates) if len(rates) > 1 else 0.0
    log(f"Samples/sec per worker: {mean:.1f} +-{spread:.1f}")
    log(
        f"Total samples/sec on {dt.size()} worker(s): {dt.size() * mean:.1f} "
        f"+-{dt.size() * spread:.1f}"
    )
    opt.close()
    dt.shutdown()


if __name__ == "__main__":
    main()
