"""The named models' layers: parameters and forward FLOPs per sample, with their sources.

A FLOP is one multiply or one add (a multiply-accumulate is 2). A sample is an image
for the CNNs and a sequence for bert and gpt. The CNN layers are built here from the
architectures' published layer tables, so the sums can be checked against the totals
their papers and torchvision's model cards give:

- resnet50 / resnet101: He et al. 2016, Table 1, in torchvision's v1.5 form (stride on the
  3x3 conv): 25.6M / 44.5M parameters, 4.1 / 7.8 GMACs at 224x224.
- vgg16: Simonyan & Zisserman 2015, configuration D: 138.4M parameters, 15.5 GMACs.
- alexnet: torchvision's single-tower AlexNet (Krizhevsky 2014, "one weird trick"):
  61.1M parameters, 0.71 GMACs.
- inception3: Szegedy et al. 2016 at 299x299, by block (the stem, Mixed_5b ... Mixed_7c,
  the classifier; auxiliary head left out, as at inference): 23.8M parameters, 5.7 GMACs.
  Per-block figures are our count of torchvision's definition, rounded.
- bert-base / bert-large: Devlin et al. 2019 (L=12, H=768 / L=24, H=1024, vocabulary
  30,522, 512 positions); per encoder layer 12H^2 + 13H parameters and 24H^2 + 4sH
  forward FLOPs per token (the 4sH is attention's two s x s products).
- gpt: the decoder of Narayanan et al. 2021 (Megatron-LM), same per-layer counts, with
  the logit layer's 2VH FLOPs per token (tied embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODEL_NAMES", "Layer", "ModelShape", "build", "megatron_flops_per_sample"]

MODEL_NAMES = (
    "resnet50",
    "resnet101",
    "inception3",
    "vgg16",
    "alexnet",
    "bert-base",
    "bert-large",
    "gpt",
)


@dataclass(frozen=True)
class Layer:
    name: str
    params: float
    flops: float  # forward FLOPs per sample
    outputs: float = 0.0  # output elements per sample: what a pipeline stage ends sending


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: tuple[Layer, ...]  # in forward order
    source: str
    transformer: bool = False
    hidden: int = 0
    seq_len: int = 0
    blocks: int = 0  # transformer layers
    vocab: int = 0

    @property
    def params(self) -> float:
        return sum(layer.params for layer in self.layers)

    @property
    def flops(self) -> float:
        return sum(layer.flops for layer in self.layers)


def _conv(name: str, cin: int, cout: int, k: int, hw: int, bias: bool = False) -> Layer:
    """A k x k convolution producing hw x hw outputs: k^2*cin*cout weights (+ BN's 2*cout,
    or a bias), 2*k^2*cin*cout*hw^2 FLOPs."""
    weights = k * k * cin * cout
    params = weights + (cout if bias else 2 * cout)
    return Layer(name, params, 2.0 * weights * hw * hw, float(cout * hw * hw))


def _fc(name: str, cin: int, cout: int) -> Layer:
    return Layer(name, cin * cout + cout, 2.0 * cin * cout, float(cout))


def _resnet(name: str, blocks: tuple[int, int, int, int]) -> ModelShape:
    """Bottleneck ResNet at 224x224: stem 7x7/2 then max-pool to 56x56; four stages."""
    layers = [_conv("conv1", 3, 64, 7, 112)]
    cin, hw = 64, 56
    for stage, (n, mid) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
        out_hw = hw if stage == 0 else hw // 2
        for b in range(n):
            parts = [
                _conv("a", cin, mid, 1, hw if b == 0 else out_hw),
                _conv("b", mid, mid, 3, out_hw),
                _conv("c", mid, 4 * mid, 1, out_hw),
            ]
            if b == 0:
                parts.append(_conv("down", cin, 4 * mid, 1, out_hw))
            layers.append(
                Layer(
                    f"layer{stage + 1}.{b}",
                    sum(p.params for p in parts),
                    sum(p.flops for p in parts),
                    parts[2].outputs,
                )
            )
            cin = 4 * mid
        hw = out_hw
    layers.append(_fc("fc", 2048, 1000))
    return ModelShape(name, tuple(layers), "He et al. 2016 Table 1 (torchvision v1.5)")


def _vgg16() -> ModelShape:
    cfg = (64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0)
    layers, cin, hw = [], 3, 224
    for i, c in enumerate(cfg):
        if c == 0:  # max-pool
            hw //= 2
            continue
        layers.append(_conv(f"conv{i}", cin, c, 3, hw, bias=True))
        cin = c
    layers += [_fc("fc6", 512 * 7 * 7, 4096), _fc("fc7", 4096, 4096), _fc("fc8", 4096, 1000)]
    return ModelShape("vgg16", tuple(layers), "Simonyan & Zisserman 2015, configuration D")


def _alexnet() -> ModelShape:
    layers = (
        _conv("conv1", 3, 64, 11, 55, bias=True),
        _conv("conv2", 64, 192, 5, 27, bias=True),
        _conv("conv3", 192, 384, 3, 13, bias=True),
        _conv("conv4", 384, 256, 3, 13, bias=True),
        _conv("conv5", 256, 256, 3, 13, bias=True),
        _fc("fc6", 256 * 6 * 6, 4096),
        _fc("fc7", 4096, 4096),
        _fc("fc8", 4096, 1000),
    )
    return ModelShape("alexnet", layers, "torchvision AlexNet (Krizhevsky 2014)")


#: Inception v3 by block: (name, parameters, forward GMACs, output channels x side), our
#: count of torchvision's definition, rounded; sums 23.8M parameters and 5.7 GMACs
#: (Szegedy et al. 2016, whose Table 1 gives the output sizes).
_INCEPTION3 = (
    ("stem", 0.17e6, 1.30, 192, 35),
    ("Mixed_5b", 0.26e6, 0.32, 256, 35),
    ("Mixed_5c", 0.28e6, 0.34, 288, 35),
    ("Mixed_5d", 0.29e6, 0.35, 288, 35),
    ("Mixed_6a", 1.15e6, 0.45, 768, 17),
    ("Mixed_6b", 1.30e6, 0.38, 768, 17),
    ("Mixed_6c", 1.69e6, 0.49, 768, 17),
    ("Mixed_6d", 1.69e6, 0.49, 768, 17),
    ("Mixed_6e", 2.14e6, 0.62, 768, 17),
    ("Mixed_7a", 1.70e6, 0.28, 1280, 8),
    ("Mixed_7b", 5.04e6, 0.32, 2048, 8),
    ("Mixed_7c", 6.07e6, 0.39, 2048, 8),
    ("fc", 2.05e6, 0.002, 1000, 1),
)


def _inception3() -> ModelShape:
    layers = tuple(Layer(n, p, 2e9 * g, float(c * side * side)) for n, p, g, c, side in _INCEPTION3)
    return ModelShape("inception3", layers, "Szegedy et al. 2016; block counts of torchvision")


def _transformer(name: str, blocks: int, hidden: int, seq: int, vocab: int, pos: int) -> ModelShape:
    """Embedding, ``blocks`` layers of 12H^2+13H parameters and (24H^2 + 4sH)*s forward
    FLOPs per sequence, and the tied logit layer's 2VH FLOPs per token."""
    h, s = hidden, seq
    layers = [Layer("embedding", (vocab + pos) * h, 0.0, float(s * h))]
    block = (12.0 * h * h + 13 * h, (24.0 * h * h + 4.0 * s * h) * s, float(s * h))
    layers += [Layer(f"block{i}", *block) for i in range(blocks)]
    layers.append(Layer("logits", 2.0 * h, 2.0 * vocab * h * s, float(s * vocab)))
    source = (
        "Devlin et al. 2019" if name.startswith("bert") else "Narayanan et al. 2021 (GPT shape)"
    )
    return ModelShape(
        name,
        tuple(layers),
        source,
        transformer=True,
        hidden=h,
        seq_len=s,
        blocks=blocks,
        vocab=vocab,
    )


def build(
    name: str, *, seq_len: int = 128, layers: int = 0, hidden: int = 0, vocab: int = 0
) -> ModelShape:
    """The named model; bert-* take ``seq_len``; gpt takes all four."""
    if name == "resnet50":
        return _resnet(name, (3, 4, 6, 3))
    if name == "resnet101":
        return _resnet(name, (3, 4, 23, 3))
    if name == "vgg16":
        return _vgg16()
    if name == "alexnet":
        return _alexnet()
    if name == "inception3":
        return _inception3()
    if name == "bert-base":
        return _transformer(name, 12, 768, seq_len, 30522, 512)
    if name == "bert-large":
        return _transformer(name, 24, 1024, seq_len, 30522, 512)
    if name == "gpt":
        return _transformer(name, layers, hidden, seq_len, vocab, seq_len)
    raise ValueError(f"unknown model {name!r}")


def megatron_flops_per_sample(model: ModelShape, checkpointing: bool) -> float:
    """FLOPs of one training sample. Transformers: Narayanan et al. 2021, eq. 3 divided by
    the batch: 72*s*l*h^2*(1 + s/6h) + 6*s*h*V without recomputation; with it the layers'
    forward runs twice, 96*s*l*h^2*(1 + s/6h + V/16lh). CNNs: 3x forward (backward is
    twice the forward), 4x when recomputing."""
    if not model.transformer:
        return (4.0 if checkpointing else 3.0) * model.flops
    s, h, n, v = model.seq_len, model.hidden, model.blocks, model.vocab
    passes = 96.0 if checkpointing else 72.0
    return passes * s * n * h * h * (1 + s / (6 * h)) + 6.0 * s * h * v


def boundary_outputs(model: ModelShape, stages: int) -> float:
    """Elements per sample that cross the busiest boundary when the layers are cut into
    ``stages`` runs of about equal FLOPs (a pipeline's stages)."""
    if stages <= 1:
        return 0.0
    total = model.flops or 1.0
    crossing, done, cut = 0.0, 0.0, 1
    for layer in model.layers[:-1]:
        done += layer.flops
        if cut < stages and done >= cut * total / stages:
            crossing = max(crossing, layer.outputs)
            cut += 1
    return crossing
