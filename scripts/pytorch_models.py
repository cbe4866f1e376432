"""PyTorch twins of Tessera's model zoo, for weights written by `tessera export`.

Each class reproduces the matching model of host/src/model/mod.rs exactly: the same module
names (so `state_dict()` names equal the exported ones), the same computation (flatten,
activations, padding, strides, projection shortcuts, pooling, BatchNorm eps 1e-5 and momentum
0.1). Only `torch` is needed; safetensors files are read by hand (`read_safetensors`).

    import pytorch_models
    model = pytorch_models.load_exported("model.safetensors")  # strict load, eval mode
    logits = model(images)                                      # (N, C, H, W) float32

or, step by step:

    tensors, metadata = pytorch_models.read_safetensors("model.safetensors")
    model = pytorch_models.build(json.loads(metadata["tessera.model"]),
                                 json.loads(metadata["tessera.input"]))
    pytorch_models.apply_modules(model, json.loads(metadata.get("tessera.modules", "[]")), tensors)
    model.load_state_dict(tensors, strict=True)

A model a method changed by surgery keeps some plugin modules in the export (listed in the
`tessera.modules` metadata: path, kind, attributes); `apply_modules` puts their twins in place,
with Composer's module names (BlurPool's `BlurConv2d`/`BlurMaxPool2d`, `SqueezeExciteConv2d`,
Factorize's `FactorizedConv2d`/`FactorizedLinear`, ALiBi's attention on GPT-2 with its zero
position table, the gated MLP of gated linear units, the attention of rotary/qk_norm, the
squared-ReLU MLP and the soft-capped head), so the state dict loads strictly.
Train-time-only methods (weight standardization, Ghost BatchNorm, stochastic depth) are folded
into plain modules by `tessera export` and need nothing here.
"""

import json
import math
import os
import struct
import sys

import torch
from torch import nn

__all__ = [
    "MLP",
    "CNN",
    "BasicBlock",
    "CifarResNet",
    "GPT2LMHeadModel",
    "Airbench",
    "build",
    "apply_modules",
    "read_safetensors",
    "load_exported",
]

# PyTorch's BatchNorm2d defaults, which Tessera uses too.
BN_EPS = 1e-5
BN_MOMENTUM = 0.1


# LayerNorm's and GroupNorm's epsilon (PyTorch's default, as Tessera's).
NORM_EPS = 1e-5


def _batch_norm(channels):
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


def _channel_norm(channels, norm):
    """The cnn's norm: BatchNorm2d, or GroupNorm in gcd(channels, 8) groups (`norm = "group"`)."""
    if norm == "group":
        return nn.GroupNorm(math.gcd(channels, 8), channels, eps=NORM_EPS)
    return _batch_norm(channels)


def _conv(cin, cout, kernel, stride, padding):
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)


class MLP(nn.Module):
    """`flatten -> (linear -> [layernorm] -> relu -> [dropout])* -> linear`, numbered as one
    `nn.Sequential` `layers` (without norm and dropout the linear layers are `layers.0`,
    `layers.2`, ...)."""

    def __init__(self, in_features, hidden, num_classes, norm="none", dropout=0.0):
        super().__init__()
        self.flatten = nn.Flatten()
        layers = []
        fin = in_features
        for h in hidden:
            layers.append(nn.Linear(fin, h))
            if norm == "layer":
                layers.append(nn.LayerNorm(h, eps=NORM_EPS))
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            fin = h
        layers.append(nn.Linear(fin, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(self.flatten(x))


class CNN(nn.Module):
    """Two conv(3x3, pad 1, no bias)-norm-ReLU-maxpool(2) stages of widths w and 2w (norm:
    BatchNorm2d, or GroupNorm with `norm = "group"`), then flatten -> linear(4w) -> relu ->
    linear."""

    def __init__(self, channels, height, width_px, width, num_classes, norm="batch"):
        super().__init__()
        c1, c2 = width, 2 * width
        self.features = nn.Sequential(
            _conv(channels, c1, 3, 1, 1),
            _channel_norm(c1, norm),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            _conv(c1, c2, 3, 1, 1),
            _channel_norm(c2, norm),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
        )
        flat = c2 * (height // 4) * (width_px // 4)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, 4 * width),
            nn.ReLU(),
            nn.Linear(4 * width, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """`relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`; the shortcut is the identity, or
    a 1x1 conv + BN projection (option B) when the stride or the width changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, stride, 1)
        self.bn1 = _batch_norm(cout)
        self.conv2 = _conv(cout, cout, 3, 1, 1)
        self.bn2 = _batch_norm(cout)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(_conv(cin, cout, 1, stride, 0), _batch_norm(cout))
        else:
            self.shortcut = None

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(out + shortcut)


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dimensions: `(N, C, H, W) -> (N, C)`."""

    def forward(self, x):
        return x.mean(dim=(-2, -1))


class CifarResNet(nn.Module):
    """CIFAR-style ResNet (He et al. 2016, section 4.2): depth 6n + 2, conv1-bn1-relu, three
    stages of n basic blocks of widths w, 2w, 4w (stride 2 entering stages 2 and 3), global
    average pooling and `fc`."""

    def __init__(self, channels, depth, width, num_classes):
        super().__init__()
        if (depth - 2) % 6 != 0:
            raise ValueError(f"depth {depth} is not 6n + 2")
        n = (depth - 2) // 6
        self.conv1 = _conv(channels, width, 3, 1, 1)
        self.bn1 = _batch_norm(width)
        self.relu = nn.ReLU()
        cin = width
        for stage in range(3):
            cout = width << stage
            blocks = []
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(cin, cout, stride))
                cin = cout
            setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
        self.avgpool = GlobalAvgPool()
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x))


class ConvGroup(nn.Module):
    """airbench's `ConvGroup`: conv1 (3x3, pad 1, no bias) -> pool (MaxPool2d(2)) -> norm1 ->
    GELU -> conv2 -> norm2 -> GELU, norms `BatchNorm2d(eps=1e-12, momentum=0.4)` (airbench's
    `BatchNorm(momentum=0.6)`)."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, 1, 1)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = nn.BatchNorm2d(cout, eps=AIRBENCH_BN_EPS, momentum=AIRBENCH_BN_MOMENTUM)
        self.conv2 = _conv(cout, cout, 3, 1, 1)
        self.norm2 = nn.BatchNorm2d(cout, eps=AIRBENCH_BN_EPS, momentum=AIRBENCH_BN_MOMENTUM)
        self.activ = nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class GlobalMaxPool(nn.Module):
    """Max over the spatial dimensions: `(N, C, H, W) -> (N, C)` (airbench's `MaxPool2d(3)` +
    flatten on its last 3x3 map)."""

    def forward(self, x):
        return x.amax(dim=(-2, -1))


# airbench's BatchNorm (eps 1e-12, momentum 0.6 in its convention = 0.4 in PyTorch's) and head
# scaling (1/9).
AIRBENCH_BN_EPS = 1e-12
AIRBENCH_BN_MOMENTUM = 0.4
AIRBENCH_SCALING = 1 / 9


class Airbench(nn.Module):
    """Keller Jordan's airbench network (airbench94_muon.py's `CifarNet` names): `whiten` a 2x2
    conv with bias to 2*C*4 channels, `layers` = GELU, three `ConvGroup`s, global max-pool;
    `head` a linear layer without bias; the output times 1/9."""

    def __init__(self, channels, widths, num_classes):
        super().__init__()
        whiten_width = 2 * channels * 2 * 2
        self.whiten = nn.Conv2d(channels, whiten_width, 2, padding=0, bias=True)
        self.layers = nn.Sequential(
            nn.GELU(),
            ConvGroup(whiten_width, widths[0]),
            ConvGroup(widths[0], widths[1]),
            ConvGroup(widths[1], widths[2]),
            GlobalMaxPool(),
        )
        self.head = nn.Linear(widths[2], num_classes, bias=False)

    def forward(self, x):
        return self.head(self.layers(self.whiten(x))) * AIRBENCH_SCALING


def _input_shape(input_shape):
    if input_shape is None:
        return 1, 28, 28
    if isinstance(input_shape, dict):
        return int(input_shape["channels"]), int(input_shape["height"]), int(input_shape["width"])
    channels, height, width = input_shape
    return int(channels), int(height), int(width)


def build(model_config, input_shape=None):
    """The module for Tessera's `[model]` config (the `tessera.model` metadata of an exported
    file, as a dict; for a TorchScript model, the file it names loaded with `torch.jit.load`) and input shape (the `tessera.input` metadata: a dict with channels,
    height and width, or a `(C, H, W)` tuple; default Fashion-MNIST's 1x28x28)."""
    if "torchscript" in model_config:
        # A model made in PyTorch (`[model] torchscript`): the file itself, as `torch.jit.load`
        # gives it (its state_dict names are those Tessera trained and exported).
        return torch.jit.load(model_config["torchscript"], map_location="cpu")
    channels, height, width_px = _input_shape(input_shape)
    name = model_config["name"]
    classes = int(model_config["num_classes"])
    if name == "mlp":
        hidden = [int(h) for h in model_config.get("hidden") or []]
        norm = model_config.get("norm") or "none"
        dropout = float(model_config.get("dropout") or 0.0)
        return MLP(channels * height * width_px, hidden, classes, norm, dropout)
    if name == "cnn":
        width = int(model_config.get("width") or 32)
        norm = model_config.get("norm") or "batch"
        return CNN(channels, height, width_px, width, classes, norm)
    if name in ("resnet20", "resnet56"):
        width = int(model_config.get("width") or 16)
        depth = 20 if name == "resnet20" else 56
        return CifarResNet(channels, depth, width, classes)
    if name in ("resnet18", "resnet50"):
        return _torchvision_resnet(name, channels, int(model_config.get("width") or 64), classes)
    if name == "gpt2":
        return _gpt2(model_config, classes)
    if name == "airbench":
        widths = [int(w) for w in model_config.get("widths") or [64, 256, 256]]
        return Airbench(channels, widths, classes)
    raise ValueError(f"unknown Tessera model {name!r}")


# ---- GPT-2 ------------------------------------------------------------------------------

# Tessera's gpt2 defaults (GPT-2 small), for a config that leaves a key out.
GPT2_DEFAULTS = {
    "n_layer": 12,
    "n_head": 12,
    "n_embd": 768,
    "n_positions": 1024,
    "tie_embeddings": True,
    "layer_norm_epsilon": 1e-5,
}


def _gpt2_sizes(model_config, classes):
    sizes = {k: model_config.get(k, v) for k, v in GPT2_DEFAULTS.items()}
    sizes["vocab_size"] = int(model_config.get("vocab_size") or classes)
    sizes["dropout"] = float(model_config.get("dropout") or 0.0)
    return sizes


def _gpt2(model_config, classes):
    """Hugging Face's own `GPT2LMHeadModel` (not a twin) when `transformers` imports and
    `TESSERA_GPT2_TWIN` is not set to 1 (scripts/ensure-transformers.sh installs it), else
    `GPT2LMHeadModel` below, a plain-PyTorch twin with the same state_dict."""
    s = _gpt2_sizes(model_config, classes)
    if os.environ.get("TESSERA_GPT2_TWIN") != "1":
        try:
            import transformers
        except ImportError:
            transformers = None
        if transformers is not None:
            config = transformers.GPT2Config(
                vocab_size=s["vocab_size"],
                n_positions=int(s["n_positions"]),
                n_embd=int(s["n_embd"]),
                n_layer=int(s["n_layer"]),
                n_head=int(s["n_head"]),
                resid_pdrop=s["dropout"],
                embd_pdrop=s["dropout"],
                attn_pdrop=s["dropout"],
                layer_norm_epsilon=float(s["layer_norm_epsilon"]),
                tie_word_embeddings=bool(s["tie_embeddings"]),
                bos_token_id=None,
                eos_token_id=None,
            )
            return transformers.GPT2LMHeadModel(config)
    return GPT2LMHeadModel(
        s["vocab_size"],
        int(s["n_positions"]),
        int(s["n_embd"]),
        int(s["n_layer"]),
        int(s["n_head"]),
        s["dropout"],
        float(s["layer_norm_epsilon"]),
        bool(s["tie_embeddings"]),
    )


class Conv1D(nn.Module):
    """Hugging Face's `Conv1D`: `x @ weight + bias`, `weight` stored `(in, out)`."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class GPT2MLP(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = Conv1D(4 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, 4 * n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh")))


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = GPT2Attention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = GPT2MLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, vocab_size, n_positions, n_embd, n_layer, n_head, dropout, eps):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPT2Block(n_embd, n_head, dropout, eps) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=eps)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.drop(self.wte(ids) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    """A plain-PyTorch twin of Hugging Face's `GPT2LMHeadModel` (and of Tessera's gpt2): the same
    state_dict names and shapes (`lm_head.weight` included, tied to `transformer.wte.weight`
    when `tie_embeddings`), token ids `(B, T)` in, logits `(B, T, vocab)` out."""

    def __init__(self, vocab_size, n_positions, n_embd, n_layer, n_head, dropout=0.0,
                 eps=1e-5, tie_embeddings=True):
        super().__init__()
        self.transformer = GPT2Model(vocab_size, n_positions, n_embd, n_layer, n_head, dropout, eps)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids):
        return self.lm_head(self.transformer(ids))


def _torchvision_resnet(name, channels, width, classes):
    """torchvision's own `resnet18`/`resnet50` (not a twin): the reference Tessera's ImageNet
    ResNets are named after. torchvision fixes the width at 64 and the stem at 3 channels; for
    other input channels its `conv1` is swapped for one with the same name and shape rules."""
    try:
        import torchvision
    except ImportError as e:
        raise ValueError(
            f"model {name!r} is checked against torchvision, which cannot be imported ({e}); "
            "scripts/ensure-torchvision.sh installs it"
        ) from e
    if width != 64:
        raise ValueError(f"torchvision's {name} has width 64, this model has {width}")
    model = getattr(torchvision.models, name)(num_classes=classes)
    if channels != 3:
        model.conv1 = nn.Conv2d(channels, width, 7, stride=2, padding=3, bias=False)
    return model


# ---- twins of the plugin modules that stay in an exported network ----------------------


def blur_2d(x, stride, blur_filter):
    """Composer's `blur_2d`: a depthwise 3x3 blur with "same" padding and `stride`; an input
    too small for the filter comes back unchanged."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    fh, fw = blur_filter.shape[2], blur_filter.shape[3]
    padding = (fh // 2, fw // 2)
    if height + 2 * padding[0] < fh or width + 2 * padding[1] < fw:
        return x
    if blur_filter.shape[0] == 1 and channels > 1:
        blur_filter = blur_filter.repeat(channels, 1, 1, 1)
    blur_filter = blur_filter.to(dtype=x.dtype, device=x.device)
    return nn.functional.conv2d(x, blur_filter, stride=stride, padding=padding, groups=channels)


class BlurConv2d(nn.Module):
    """Composer's `BlurConv2d` (`blur_conv2d`): a conv with a blur before it (`blur_first`,
    the conv keeping its stride) or after it (the conv at stride 1, the blur striding)."""

    def __init__(self, attrs, bias):
        super().__init__()
        blur_first = bool(attrs["blur_first"])
        channels = int(attrs["in_channels"] if blur_first else attrs["out_channels"])
        self.blur_first = blur_first
        self.blur_stride = int(attrs["blur_stride"])
        self.conv = nn.Conv2d(
            int(attrs["in_channels"]),
            int(attrs["out_channels"]),
            int(attrs["kernel_size"]),
            stride=int(attrs["conv_stride"]),
            padding=int(attrs["padding"]),
            groups=int(attrs["groups"]),
            bias=bias,
        )
        self.register_buffer("blur_filter", torch.zeros(channels, 1, 3, 3))

    def forward(self, x):
        if self.blur_first:
            return self.conv(blur_2d(x, self.blur_stride, self.blur_filter))
        return blur_2d(self.conv(x), self.blur_stride, self.blur_filter)


class BlurMaxPool2d(nn.Module):
    """Composer's `BlurMaxPool2d` (`blur_max_pool2d`): max-pool at stride 1, then a striding
    blur."""

    def __init__(self, attrs):
        super().__init__()
        self.kernel_size = int(attrs["kernel_size"])
        self.stride = int(attrs["stride"])
        self.padding = int(attrs["padding"])
        self.register_buffer("filt2d", torch.zeros(1, 1, 3, 3))

    def forward(self, x):
        x = nn.functional.max_pool2d(x, self.kernel_size, stride=1, padding=self.padding)
        return blur_2d(x, self.stride, self.filt2d)


class SqueezeExcite2d(nn.Module):
    """Composer's `SqueezeExcite2d`: pool, Linear, ReLU, Linear, sigmoid gate per channel."""

    def __init__(self, channels, latent):
        super().__init__()
        self.pool_and_mlp = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(channels, latent, bias=False),
            nn.ReLU(),
            nn.Linear(latent, channels, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        n, c = x.shape[0], x.shape[1]
        return x * self.pool_and_mlp(x).view(n, c, 1, 1)


class SqueezeExciteConv2d(nn.Module):
    """Composer's `SqueezeExciteConv2d` (`squeeze_excite_conv2d`): the original conv, then
    its gate."""

    def __init__(self, conv, latent):
        super().__init__()
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_channels, latent)

    def forward(self, x):
        return self.se(self.conv(x))


class FactorizedConv2d(nn.Module):
    """Composer's `FactorizedConv2d` (`factorized_conv2d`): a k x k conv to `latent` channels
    without bias (the original stride and padding), then a 1x1 conv with bias."""

    def __init__(self, conv, latent):
        super().__init__()
        self.module0 = nn.Conv2d(
            conv.in_channels,
            latent,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            bias=False,
        )
        self.module1 = nn.Conv2d(latent, conv.out_channels, 1, bias=True)

    def forward(self, x):
        return self.module1(self.module0(x))


class FactorizedLinear(nn.Module):
    """Composer's `FactorizedLinear` (`factorized_linear`): Linear to `latent` without bias,
    then Linear with bias."""

    def __init__(self, linear, latent):
        super().__init__()
        self.module0 = nn.Linear(linear.in_features, latent, bias=False)
        self.module1 = nn.Linear(latent, linear.out_features, bias=True)

    def forward(self, x):
        return self.module1(self.module0(x))


class AlibiGPT2Attention(nn.Module):
    """ALiBi's `alibi_gpt2_attention` (plugins/alibi; Composer's patched `GPT2Attention._attn`):
    GPT-2 attention over the same `c_attn`/`c_proj` whose scores are `q kᵀ / √d` plus the
    `alibi` buffer `(n_head, 1, max_sequence_length)` cut to the length, then the causal mask
    (masked scores become −1e4, GPT-2's `masked_bias`), softmax, attention dropout, `c_proj` and
    residual dropout. No position limit but `max_sequence_length`. Inside Hugging Face's
    `GPT2Block` (`hugging_face`) it returns `(output, None)` as the block expects."""

    def __init__(self, attrs, hugging_face=False):
        super().__init__()
        n_embd, self.n_head = int(attrs["n_embd"]), int(attrs["n_head"])
        self.hugging_face = hugging_face
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(float(attrs.get("attn_pdrop", 0.0)))
        self.resid_dropout = nn.Dropout(float(attrs.get("resid_pdrop", 0.0)))
        self.register_buffer("alibi", torch.zeros(self.n_head, 1, int(attrs["max_sequence_length"])))

    def forward(self, x, *args, **kwargs):
        b, t, c = x.shape
        if t > self.alibi.shape[-1]:
            raise ValueError(
                f"a sequence of {t} tokens is longer than ALiBi's max_sequence_length "
                f"{self.alibi.shape[-1]}"
            )
        d = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + self.alibi[:, :, :t].to(q.dtype)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = torch.where(causal, scores, torch.tensor(-1e4, dtype=scores.dtype, device=x.device))
        probs = self.attn_dropout(scores.softmax(dim=-1))
        y = (probs @ v).transpose(1, 2).contiguous().view(b, t, c)
        out = self.resid_dropout(self.c_proj(y))
        return (out, None) if self.hugging_face else out


# The `act_fn` attribute of `glu_gpt2_mlp`: an index into gated_linear_units' activations.
GLU_ACTIVATIONS = [
    lambda x: nn.functional.gelu(x),
    lambda x: nn.functional.gelu(x, approximate="tanh"),
    torch.relu,
    nn.functional.silu,
    torch.sigmoid,
    torch.tanh,
]


class GluGPT2MLP(nn.Module):
    """Gated linear units' `glu_gpt2_mlp` (plugins/gated_linear_units; Composer's
    `BERTGatedFFOutput` in GPT-2's pre-LN block): `dropout(wo(act(gated_layer(x)) ⊙
    non_gated_layer(x)))`, PyTorch `Linear` layers under Composer's names."""

    def __init__(self, attrs):
        super().__init__()
        d, d_ff = int(attrs["n_embd"]), int(attrs["n_inner"])
        self.act = GLU_ACTIVATIONS[int(attrs["act_fn"])]
        self.gated_layer = nn.Linear(d, d_ff, bias=bool(attrs.get("gated_layer_bias", 0)))
        self.non_gated_layer = nn.Linear(d, d_ff, bias=bool(attrs.get("non_gated_layer_bias", 0)))
        self.wo = nn.Linear(d_ff, d)
        self.dropout = nn.Dropout(float(attrs.get("resid_pdrop", 0.0)))

    def forward(self, x):
        return self.dropout(self.wo(self.act(self.gated_layer(x)) * self.non_gated_layer(x)))


def rotate_half(x):
    """GPT-NeoX's (and Hugging Face LLaMA's) `rotate_half`: `[x1, x2]` -> `[-x2, x1]` over the
    last dimension split in halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(t, dims, base, device, dtype):
    """The rotary cosines and sines `(t, dims)` for positions `0..t`: angles
    `m * base^(-2i/dims)` duplicated over both halves (GPT-NeoX's `emb = cat(freqs, freqs)`),
    computed in float64 and rounded once to `dtype`, as plugins/gpt_surgery computes them."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.float64, device=device) / dims))
    angles = torch.outer(torch.arange(t, dtype=torch.float64, device=device), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x, cos, sin):
    """Rotates the first `cos.shape[-1]` features of every head of `x` `(B, H, T, D)`
    (GPT-NeoX's partial rotary: `x_rot * cos + rotate_half(x_rot) * sin`, the rest passed
    through), in float32 for a half-precision `x`, returning `x`'s dtype."""
    dims = cos.shape[-1]
    y = x.to(cos.dtype)
    rot, rest = y[..., :dims], y[..., dims:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1).to(x.dtype)


class GPT2AttentionExt(nn.Module):
    """`gpt2_attention_ext` (plugins/rotary and plugins/qk_norm, built by plugins/gpt_surgery):
    GPT-2's attention over the same `c_attn`/`c_proj` whose q and k are RMS-normalised per head
    (`qk_norm`: `F.rms_norm(x, (D,))`, no weight) and rotated by their positions (`rotary`:
    the first `rotary_dims` features of each head, base `rotary_base`), then the fused causal
    `scaled_dot_product_attention`, `c_proj` and residual dropout. Inside Hugging Face's
    `GPT2Block` (`hugging_face`) it returns `(output, None)` as the block expects."""

    def __init__(self, attrs, hugging_face=False):
        super().__init__()
        n_embd, self.n_head = int(attrs["n_embd"]), int(attrs["n_head"])
        self.hugging_face = hugging_face
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.attn_pdrop = float(attrs.get("attn_pdrop", 0.0))
        self.resid_dropout = nn.Dropout(float(attrs.get("resid_pdrop", 0.0)))
        self.qk_norm = bool(attrs.get("qk_norm", 0))
        self.rotary_dims = int(attrs.get("rotary_dims", 0)) if attrs.get("rotary", 0) else 0
        self.rotary_base = float(attrs.get("rotary_base", 10000.0))

    def forward(self, x, *args, **kwargs):
        b, t, c = x.shape
        d = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d).transpose(1, 2) for z in (q, k, v))
        if self.qk_norm:
            q = nn.functional.rms_norm(q, (d,)).to(v.dtype)
            k = nn.functional.rms_norm(k, (d,)).to(v.dtype)
        if self.rotary_dims:
            dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            cos, sin = rotary_cos_sin(t, self.rotary_dims, self.rotary_base, x.device, dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.attn_pdrop if self.training else 0.0
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        out = self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        return (out, None) if self.hugging_face else out


class ReluSquaredGPT2MLP(nn.Module):
    """relu_squared's `relu_squared_gpt2_mlp` (Primer; modded-nanogpt): GPT-2's MLP over the
    same `c_fc`/`c_proj` with `relu(x)^2` in place of GELU."""

    def __init__(self, attrs):
        super().__init__()
        n_embd, n_inner = int(attrs["n_embd"]), int(attrs["n_inner"])
        self.c_fc = Conv1D(n_inner, n_embd)
        self.c_proj = Conv1D(n_embd, n_inner)
        self.dropout = nn.Dropout(float(attrs.get("resid_pdrop", 0.0)))

    def forward(self, x):
        return self.dropout(self.c_proj(torch.relu(self.c_fc(x)).square()))


class LogitSoftcapLMHead(nn.Module):
    """logit_softcap's `logit_softcap_lm_head`: GPT-2's head, then `cap * tanh(logits / cap)` in
    float32. Untied, it holds `weight` (`lm_head.weight`); tied (`tied` = 1), it multiplies by
    the token embedding's weight and holds no tensor (the export has no `lm_head.weight`).
    Half-precision logits are capped in float32 (modded-nanogpt's `logits.float()`)."""

    def __init__(self, attrs, wte=None):
        super().__init__()
        self.cap = float(attrs["cap"])
        if bool(attrs.get("tied", 0)):
            # Not registered: the weight is `transformer.wte.weight`, loaded there.
            object.__setattr__(self, "wte", wte)
            self.weight = None
        else:
            self.wte = None
            self.weight = nn.Parameter(
                torch.zeros(int(attrs["out_features"]), int(attrs["in_features"]))
            )

    def forward(self, x):
        weight = self.wte.weight if self.weight is None else self.weight
        logits = nn.functional.linear(x, weight)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return self.cap * torch.tanh(logits / self.cap)


def _resize_positions(model, tensors):
    """ALiBi folds its zero position table into a plain `transformer.wpe` of
    `(max_sequence_length, n_embd)`: the embedding takes the exported table's size."""
    weight = tensors.get("transformer.wpe.weight")
    wpe = model.get_submodule("transformer.wpe")
    if weight is not None and tuple(wpe.weight.shape) != tuple(weight.shape):
        _set_submodule(model, "transformer.wpe", nn.Embedding(weight.shape[0], weight.shape[1]))


def _set_submodule(model, path, module):
    parent, _, name = path.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    setattr(owner, name, module)


def apply_modules(model, modules, tensors):
    """Puts the twin of every plugin module kept in an export (`modules`: the `tessera.modules`
    metadata, a list of `{"path", "kind", "attrs"}`) in place in `model`, built by `build`.
    `tensors` (the exported state dict) gives the shapes the attributes do not (gate and latent
    widths, biases). Raises ValueError for a kind without a twin here."""
    for m in modules:
        path, kind, attrs = m["path"], m["kind"], m.get("attrs", {})
        if kind == "blur_conv2d":
            twin = BlurConv2d(attrs, bias=f"{path}.conv.bias" in tensors)
        elif kind == "blur_max_pool2d":
            twin = BlurMaxPool2d(attrs)
        elif kind == "squeeze_excite_conv2d":
            latent = tensors[f"{path}.se.pool_and_mlp.2.weight"].shape[0]
            twin = SqueezeExciteConv2d(model.get_submodule(path), latent)
        elif kind == "factorized_conv2d":
            latent = tensors[f"{path}.module0.weight"].shape[0]
            twin = FactorizedConv2d(model.get_submodule(path), latent)
        elif kind == "factorized_linear":
            latent = tensors[f"{path}.module0.weight"].shape[0]
            twin = FactorizedLinear(model.get_submodule(path), latent)
        elif kind == "alibi_gpt2_attention":
            hugging_face = type(model).__module__.startswith("transformers")
            twin = AlibiGPT2Attention(attrs, hugging_face)
            _resize_positions(model, tensors)
        elif kind == "glu_gpt2_mlp":
            twin = GluGPT2MLP(attrs)
        elif kind == "gpt2_attention_ext":
            hugging_face = type(model).__module__.startswith("transformers")
            twin = GPT2AttentionExt(attrs, hugging_face)
            _resize_positions(model, tensors)
        elif kind == "relu_squared_gpt2_mlp":
            twin = ReluSquaredGPT2MLP(attrs)
        elif kind == "logit_softcap_lm_head":
            twin = LogitSoftcapLMHead(attrs, model.get_submodule("transformer.wte"))
        else:
            raise ValueError(
                f"the export keeps a plugin module of kind {kind!r} at {path!r}, which "
                "scripts/pytorch_models.py has no twin for: build it yourself and load the "
                "tensors under that path"
            )
        _set_submodule(model, path, twin)
    return model


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path):
    """`(tensors, metadata)` of a safetensors file: a dict name -> CPU tensor and the
    `__metadata__` dict (strings). The format: an 8-byte little-endian header length, a JSON
    header (`dtype`, `shape`, `data_offsets` per tensor), then the raw little-endian data."""
    if sys.byteorder != "little":
        raise RuntimeError("reading safetensors by hand needs a little-endian machine")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > len(data):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(data[8 : 8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", None) or {}
    body = bytearray(data[8 + header_len :])
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * itemsize or end > len(body):
            raise ValueError(f"{path}: tensor {name!r} has inconsistent data offsets")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            flat = torch.frombuffer(body, dtype=dtype, count=count, offset=begin)
            tensors[name] = flat.clone().reshape(shape)
    return tensors, metadata


def load_exported(path, device="cpu"):
    """The model of a file written by `tessera export`, weights loaded strictly, in eval mode."""
    tensors, metadata = read_safetensors(path)
    if "tessera.model" not in metadata:
        raise ValueError(f"{path}: no tessera.model metadata (not written by tessera export?)")
    model = build(json.loads(metadata["tessera.model"]), json.loads(metadata.get("tessera.input", "null")))
    apply_modules(model, json.loads(metadata.get("tessera.modules", "[]")), tensors)
    model.load_state_dict(tensors, strict=True)
    return model.to(device).eval()
