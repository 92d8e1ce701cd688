"""Layer placement and pipeline parallelism: each rank holds consecutive layers (a stage).

``--schedule none`` runs the whole batch through the stages one after the
other (the seed's "not good" baseline: P-1 of P stages wait at any time);
``gpipe`` and ``1f1b`` cut it into ``--microbatches`` and overlap the stages
(idle share (P-1)/(M+P-1)); ``interleaved`` cuts the model into P·V stages,
rank p holding p, p+P, ... (``--virtual-stages V``); ``zb1`` and ``zb2`` split
each backward into B and W (``parallel/pipeline/``: one file per schedule family,
each owning its bubble and memory formulas). Every stage sees the whole global
batch: stage 0 feeds the input, the last computes the loss against the labels.

The model is cut as a chain of layers (``parallel/chain.py``): an ``nn.Sequential``,
or a transformers causal LM (GPT-2, Llama families) whose stages are built from the
module paths they keep; ``--split-points`` names where stages start, else
``--balance`` chooses. Parameters tied across stages (GPT-2's embedding and head)
have their gradients summed between the ranks that hold them after each backward.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain.comm import p2p, phases
from disttrain.comm.errors import UsageError
from disttrain.comm.meter import meter
from disttrain.comm.world import World
from disttrain.config import RunConfig
from disttrain.parallel import chain as chains
from disttrain.parallel import placement
from disttrain.parallel.pipeline import schedule
from disttrain.parallel.pipeline.runner import PipelineRunner, recv_ahead_default
from disttrain.parallel.settings import ParallelConfig
from disttrain.strategies.base import LossFn, Strategy, register
from disttrain.strategies.capabilities import ShardsData
from disttrain.strategies.settings import StrategySettings

__all__ = ["Pipeline", "PipelineSettings", "check_pipeline", "pipeline_settings_not_read"]


def pipeline_settings_not_read(pc: ParallelConfig) -> dict[str, str]:
    """The pipeline settings that ``pc``'s schedule switches off, and why."""
    unread = {}
    if pc.schedule == "none":
        unread["microbatches"] = "with --schedule none (whole batches)"
    if not schedule.SCHEDULES.get(pc.schedule).virtual:
        unread["virtual_stages"] = f"with --schedule {pc.schedule} (one stage per rank)"
    if pc.split_at:
        unread["balance"] = "with --split-points (the stages start at the paths named)"
    return unread


def stage_sizes_at(chain: chains.Chain, pc: ParallelConfig, cuts: int, flag: str) -> list[int]:
    """Layers per stage from ``--split-points`` (``cuts`` stages in all)."""
    v = pc.chunks
    flag = flag if v == 1 else f"{flag} x --virtual-stages {v}"
    return chains.split_sizes(chain.paths, pc.split_at, cuts, flag)


def check_pipeline(
    model: nn.Module,
    stages: int,
    batch: int,
    pc: ParallelConfig,
    stages_flag: str,
    strategy: str = "pipeline",
) -> None:
    """UsageError naming the number to change if ``model`` cannot be pipelined so
    (``strategy``: the one the user named, for the message)."""
    chain = chains.as_chain(model, strategy)
    layers = list(chain.layers)
    v = pc.chunks
    if stages * v > len(layers):
        if v == 1:
            raise UsageError(
                f"{stages_flag} {stages} is more than the model's {len(layers)} layers: "
                f"use at most {len(layers)} stages"
            )
        raise UsageError(
            f"{stages_flag} {stages} x --virtual-stages {v} = {stages * v} stages is more than "
            f"the model's {len(layers)} layers: use at most {len(layers) // stages} virtual stages"
        )
    if pc.schedule != "none":
        why = schedule.SCHEDULES.get(pc.schedule).check(pc.microbatches, stages, v)
        if why:
            raise UsageError(why)
    spec = pc.balance_spec()
    text = pc.balance
    if pc.split_at:
        spec = stage_sizes_at(chain, pc, stages * v, stages_flag)
        text = ",".join(map(str, spec))
    elif isinstance(spec, list):
        if len(spec) != stages * v:
            raise UsageError(
                f"--balance {pc.balance} lists {len(spec)} stages but there are {stages * v}: "
                f"give {stages * v} layer counts"
            )
        if sum(spec) != len(layers):
            raise UsageError(
                f"--balance {pc.balance} places {sum(spec)} layers but the model has "
                f"{len(layers)}: make the counts add up to {len(layers)}"
            )
    placement.check_every_rank_trains(layers, stages, v, spec, text)
    norm = chains.batch_norm_at(chain)
    if norm is not None and pc.schedule != "none" and pc.microbatches > 1:
        raise UsageError(
            f"the BatchNorm at {norm} would normalise each micro-batch of "
            f"{batch // pc.microbatches} samples, not the batch of {batch}: use --microbatches "
            "1 (or --schedule none), or GroupNorm/LayerNorm (SyncBatchNorm does not span "
            "micro-batches)"
        )
    if pc.schedule != "none" and batch % pc.microbatches:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise UsageError(
            f"--microbatches {pc.microbatches} does not divide the batch of {batch} per "
            f"pipeline: use one of {', '.join(map(str, divisors[:12]))}"
        )


#: the tag of the tied parameters' gradients (the runner's streams use 0 and 1)
TIED = 2


def _input_ids(batch: Mapping[str, Any]) -> torch.Tensor:
    """A transformers batch's token ids: what stage 0 is fed (the rest of the batch is the
    loss's, and a padding mask each stage's blocks read from their micro-batch's slice:
    parallel/chain.py, ``micro_batch``)."""
    if "input_ids" not in batch:
        raise UsageError(
            f"a pipeline's dict batch needs input_ids (stage 0's input), got keys "
            f"{', '.join(sorted(batch))}: yield input_ids (and labels for the loss)"
        )
    ids = batch["input_ids"]
    assert isinstance(ids, torch.Tensor)
    return ids


class PipelineSettings(StrategySettings):
    """What the pipeline reads (its stages, schedule, micro-batches, balance, recompute)."""

    main_setting: ClassVar[str | None] = "schedule"
    reads_settings = (
        "stages",
        "microbatches",
        "schedule",
        "virtual_stages",
        "balance",
        "split_points",
        "recompute",
    )

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        return pipeline_settings_not_read(config.section(ParallelConfig))

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        pc: ParallelConfig = config.section(ParallelConfig)
        world = config.train.world_size
        if pc.stages and pc.stages != world:
            raise UsageError(
                f"--stages {pc.stages} needs one worker per stage: "
                f"set --workers {pc.stages} (or --stages {world})"
            )
        check_pipeline(model, world, config.train.batch_size, pc, "--workers")


# ShardsData: every stage sees the whole batch (one data shard).
@register(
    settings=PipelineSettings,
    cost="disttrain.strategies.cost.pipeline:PipelineCost",
    shares_activations=True,  # stages exchange activations
)
class Pipeline(Strategy, ShardsData):
    """Stage ``s`` of ``P`` on rank ``s``; micro-batches flow through by ``--schedule``."""

    name = "pipeline"

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        super().__init__(config, world, loss_fn)
        self.pc: ParallelConfig = config.section(ParallelConfig)
        self.bind(None, list(range(world.world_size)), config.train.batch_size)

    def bind(self, group: ProcessGroup | None, ranks: list[int], batch: int) -> None:
        """Run as the pipeline of global ``ranks`` (``group``), on batches of ``batch``."""
        self.group = group
        self.stages = len(ranks)  # P pipeline ranks; the model is cut into P·V stages
        self.stage = ranks.index(self.world.rank)
        self.batch = batch
        self.chunks = self.pc.chunks

    @property
    def data_rank(self) -> int:
        return 0

    @property
    def data_world_size(self) -> int:
        return 1  # every stage sees the whole batch

    @property
    def microbatches(self) -> int:
        return 1 if self.pc.schedule == "none" else self.pc.microbatches

    # --- splitting ------------------------------------------------------------------
    def _sizes(self, chain: chains.Chain, sample: torch.Tensor | None) -> list[int]:
        model = chain.layers
        cuts = self.stages * self.chunks
        if self.pc.split_at:
            return stage_sizes_at(chain, self.pc, cuts, "--workers")
        spec = self.pc.balance_spec()
        if isinstance(spec, list):
            return spec
        if spec == "params":
            return placement.param_sizes(list(model), cuts)
        if sample is None:  # a script's run (dt.distribute) has no batch before its first step
            raise UsageError(
                "--balance time times the layers on a batch, and dt.distribute has none: "
                "use balance='params' or a list of layer counts"
            )
        # "time": measured on stage 0 only, so that every stage agrees on the split
        sizes = torch.zeros(cuts, dtype=torch.int64)
        if self.stage == 0:
            layers = list(model)  # timed on one micro-batch, as each stage runs them
            costs = placement.time_costs(layers, sample[: self.batch // self.microbatches])
            owns = placement.owns_parameters(layers)
            sizes = torch.tensor(placement.partition_layers(costs, owns, cuts))
        if self.stages > 1:
            with meter.paused():
                dist.broadcast(sizes, src=p2p.global_rank(self.group, 0), group=self.group)
        return [int(n) for n in sizes]

    def prepare_model(self, model: nn.Module, sample: Any) -> nn.Module:
        chain = chains.as_chain(model, self.name)
        self.layers = chain.layers  # the model as a chain; its layers hold the model's modules
        if isinstance(sample, Mapping):
            sample = _input_ids(sample)
        self.sizes = self._sizes(chain, sample)
        # measured (time) cuts are known only now; every rank has the same sizes, so all stop
        placement.check_every_rank_trains(
            list(self.layers), self.stages, self.chunks, self.sizes, self.pc.balance
        )
        parts = placement.split(self.layers, self.sizes)
        meta = [copy.deepcopy(part).to("meta") for part in parts]
        self.full = model if self.stage == 0 else None  # stage 0 gathers the model to evaluate
        # tied parameters held by more than one rank: (those ranks, this rank's parameter)
        self.tied: list[tuple[list[int], nn.Parameter]] = []
        for where, param in chains.shared_parameters(parts):
            ranks = sorted({s % self.stages for s in where})
            if len(ranks) > 1 and self.stage in ranks:
                self.tied.append((ranks, param))
        grid = schedule.build(self.pc.schedule, self.microbatches, self.stages, self.chunks)
        mine = parts[self.stage :: self.stages]  # stages p, p+P, ... (one unless interleaved)
        # late-bound: the step runner wraps self.loss_fn with the fp16 loss scale after this
        self.runner = PipelineRunner(
            mine,
            self.stage,
            grid,
            meta,
            lambda out, y: self.loss_fn(chain.output(out, y), y),  # the model's own output
            self.group,
            recompute=self.pc.recompute,
            recv_ahead=recv_ahead_default(self.pc.schedule),
        )
        return self.runner.module

    # --- the step -------------------------------------------------------------------
    def forward_backward(self, x: Any, y: Any) -> torch.Tensor:
        if isinstance(x, Mapping):  # a transformers batch: the token ids go through the stages
            x = _input_ids(x)
        loss = self.runner.run(x, y)
        if self.tied:
            self._sum_tied_gradients()
        last = self.stages - 1
        if self.stages > 1 and self.stage in (0, last):
            # only so that rank 0 logs the true loss; stage 0 waits for the last stage here
            with meter.paused(), phases.book(phases.COMMUNICATION):
                if self.stage == last:
                    assert loss is not None
                    p2p.send(loss.reshape(1), 0, self.group)
                else:
                    loss = torch.empty(1, device=x.device)
                    p2p.recv(loss, last, self.group)
                    loss = loss[0]
        return loss if loss is not None else torch.tensor(float("nan"))

    def _sum_tied_gradients(self) -> None:
        """Each tied parameter's gradient summed over the ranks that hold it, in rank order on
        every one of them (the same sum, bit for bit), so that their steps stay equal."""
        with phases.book(phases.COMMUNICATION), meter.paused():
            for ranks, param in self.tied:
                mine = param.grad if param.grad is not None else torch.zeros_like(param)
                got: dict[int, torch.Tensor] = {self.stage: mine}
                works = []
                for r in ranks:
                    if r != self.stage:
                        buf = torch.empty_like(mine)
                        works.append(p2p.isend(mine.contiguous(), r, self.group, tag=TIED))
                        works.append(p2p.irecv(buf, r, self.group, tag=TIED))
                        got[r] = buf
                for w in works:
                    w.wait()
                total = got[ranks[0]].clone()
                for r in ranks[1:]:
                    total.add_(got[r])
                param.grad = total

    def eval_model(self) -> nn.Module | None:
        """Stage 0 receives every other stage's tensors into its copy of the whole model."""
        with torch.no_grad():
            if self.stage == 0:
                assert self.full is not None
                parts = placement.split(self.layers, self.sizes)
                for s, part in enumerate(parts):
                    if s % self.stages:  # stages p, p+P, ... are rank p's
                        for t in part.state_dict().values():
                            p2p.recv(t, s % self.stages, self.group)
            else:
                for chunk in self.runner.chunks:
                    for t in chunk.state_dict().values():
                        p2p.send(t.contiguous(), 0, self.group)
        return self.full if self.stage == 0 and self.world.rank == 0 else None

    def summary(self) -> dict[str, Any]:
        m, p, v = self.microbatches, self.stages, self.chunks
        kind = schedule.SCHEDULES.get(self.pc.schedule)
        return {
            "pipeline": {
                "stages": p,
                "schedule": self.pc.schedule,
                "virtual_stages": v,
                "microbatches": m,
                "layers_per_stage": self.sizes,
                "bubble_theory": kind.bubble(m, p, v),
                "stage0_idle_share": self.runner.times.idle,
                "stage0_peak_activation_bytes": self.runner.activations.peak,
                "stage0_peak_pending_weight_grad_bytes": self.runner.pending_w_peak,
                "stage0_peak_activation_and_weight_grad_bytes": self.runner.activations.peak_total,
                "recompute": self.pc.recompute,
            }
        }

    # --- checkpoints: the layout of stages is part of the state ----------------------
    def stage_layout(self) -> dict[str, Any]:
        """Which layers this rank holds: the schedule's chunks and the layers per stage."""
        return {"ranks": self.stages, "chunks": self.chunks, "layers_per_stage": self.sizes}

    def state_dict(self) -> dict[str, Any]:
        return {"pipeline_layout": self.stage_layout()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("pipeline_layout")
        if saved is not None and saved != self.stage_layout():
            raise UsageError(
                f"--resume: the checkpoint's pipeline holds {saved['layers_per_stage']} layers "
                f"per stage on {saved['ranks']} ranks x {saved['chunks']} chunks, this run "
                f"{self.sizes} on {self.stages} x {self.chunks}: resume with the same "
                "--schedule, --virtual-stages and --balance"
            )
