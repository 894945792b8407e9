"""attnprobe.substitute and attnprobe.loss_delta: an estimator put in place of chosen attention heads of a live
PyTorch model, and the change in loss that causes.

    >>> import attnprobe
    >>> with attnprobe.substitute(model.eval(), layer=1, head=[0, 2], estimator="performer(M=16)", seed=0):
    ...     logits = model(tokens)              # heads 0 and 2 of layer_01 are Performer's estimate
    >>> report = attnprobe.loss_delta(model, batches, loss_fn, layer=1, head="all",
    ...                               estimator="performer(M=16)", seeds=range(5))
    >>> print(report)                           # Δloss per seed, mean, 95% interval, Δperplexity

Attention is found as :func:`attnprobe.capture` finds it (the same machinery: the wrapped
``scaled_dot_product_attention`` calls and ``nn.MultiheadAttention`` modules numbered in call order, or
:class:`attnprobe.LayerSpec` hooks), so "layer_01" is the layer ``capture`` names so, and head h reads the q, k
and v ``capture`` records (after RoPE; grouped-query kv head h // G). Torch is imported only when called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterable, List, Optional, Sequence

import numpy as np

from .capture import (CaptureError, LayerSpec, _finish, _has_mha, _intercept, _mha_parts, _no_attention_error,
                      _Record, _resolve, _sdpa_record, _unfused)
from .containers import head_bias


def _layer_indices(layer) -> Optional[List[int]]:
    """``layer`` (an index, "layer_NN", a list of them, or "all") as sorted indices; None for all."""
    if isinstance(layer, str) and layer == "all":
        return None
    items = list(layer) if isinstance(layer, (list, tuple, range)) else [layer]
    if not items:
        raise ValueError("layer=[] names no layer: give an index, 'layer_NN', a list of them, or 'all'")
    out = set()
    for item in items:
        if isinstance(item, str) and item.startswith("layer_") and item[6:].isdigit():
            out.add(int(item[6:]))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool) and item >= 0:
            out.add(int(item))
        else:
            raise ValueError(f"layer={item!r}: give a layer as an index (0, 1, ...) or a name 'layer_NN' as "
                             "attnprobe.capture names them, a list of those, or 'all'")
    return sorted(out)


def _head_indices(head) -> Optional[List[int]]:
    if isinstance(head, str) and head == "all":
        return None
    items = list(head) if isinstance(head, (list, tuple, range)) else [head]
    if not items or any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 0 for h in items):
        raise ValueError(f"head={head!r}: give a head index (0, 1, ...), a list of them, or 'all'")
    return sorted({int(h) for h in items})


def _causal_forms() -> dict:
    from . import estimators

    return {e["name"]: bool(e["causal"]) for e in estimators()}


class Substitution:
    """The context manager :func:`substitute` returns. Inside it, the chosen heads' attention output is the
    estimator's; ``cases`` lists the canonical case ids (``attnprobe.case_id``) substituted by the last forward
    pass, one per (layer, head, batch item), in call order, and ``layers_seen`` how many attention layers that
    pass ran."""

    def __init__(self, model, layer, head, estimator: str, seed: int, trial: int, hooks, heads, kv_heads, scale,
                 causal):
        from . import _seed, _trial, case_id

        self.model, self.estimator = model, str(estimator)
        self.seed, self.trial = _seed(seed), _trial(trial)
        case_id(0, 0, 0, 1, self.estimator)  # a bad spec is refused here, before the model runs
        self._name = self.estimator.split("(")[0].strip()
        self._causal_forms = _causal_forms()  # read once: the registry does not change during the context
        self._layers, self._heads = _layer_indices(layer), _head_indices(head)
        self._hooks = None if hooks is None else list(hooks)
        if self._hooks is not None:
            if not self._hooks:
                raise ValueError("hooks=[] names no layer: give one LayerSpec per layer, or hooks=None")
            for i, spec in enumerate(self._hooks):
                if not isinstance(spec, LayerSpec) or not spec.out:
                    raise ValueError(f"hooks[{i}]: substitute replaces the input of the LayerSpec's out module (the "
                                     "per-head attention output before the output projection): give "
                                     "LayerSpec(q=..., k=..., v=..., out=...) with out named")
            missing = [i for i in (self._layers or []) if i >= len(self._hooks)]
            if missing:
                raise ValueError(f"layer={missing[0]}: hooks name {len(self._hooks)} layers (layer_00.."
                                 f"layer_{len(self._hooks) - 1:02d}); pick one of those")
        self._shape = (heads, kv_heads, scale, causal)
        self.cases: List[str] = []
        self.layers_seen = 0
        self._modules: dict = {}  # id(nn.MultiheadAttention) -> its layer index in this forward pass
        self._stack: Optional[contextlib.ExitStack] = None

    # ---- replacing one layer's heads ----------------------------------------------------------------------------

    def _selected(self, index: int) -> bool:
        return self._layers is None or index in self._layers

    def _estimates(self, torch, index: int, layer, target):
        """Writes the estimator's output into ``target`` [B, H, N, Pv] (a torch tensor, modified in place) for
        each chosen head and batch item of layer ``index`` (numpy q, k, v of ``layer``, an attnprobe.Layer)."""
        from . import case_id, estimate

        name = f"layer_{index:02d}"
        h, g = layer.q.shape[1], layer.q.shape[1] // layer.k.shape[1]
        heads = list(range(h)) if self._heads is None else self._heads
        if heads[-1] >= h:
            raise ValueError(f"head={heads[-1]}: {name} has {h} heads (0..{h - 1}); pass heads in 0..{h - 1} or "
                             "'all'")
        mask = "causal" if layer.causal else "full"
        if layer.causal and not self._causal_forms.get(self._name, True):
            forms = [n for n, c in self._causal_forms.items() if c]
            raise ValueError(f"{name} is causal, and '{self._name}' has no causal form (its output rows depend on "
                             f"later tokens), so it cannot stand in for this layer's attention: substitute one of "
                             f"{', '.join(forms)}")
        keys = layer.k.shape[2]
        for head in heads:
            for batch in range(layer.q.shape[0]):
                # The model's bias (from its attn_mask) goes with the head: an estimator that cannot honour it
                # raises rather than stand in for a different attention.
                bias = head_bias(layer.bias, batch, head)
                out = estimate(self.estimator, layer.q[batch, head], layer.k[batch, head // g],
                               layer.v[batch, head // g], layer.scale, seed=self.seed, trial=self.trial,
                               case={"layer": index, "head": head, "batch": batch}, mask=mask, bias=bias)
                target[batch, head] = torch.from_numpy(out).to(dtype=target.dtype, device=target.device)
                self.cases.append(case_id(index, head, batch, keys, self.estimator, mask=mask))

    def _on_sdpa(self, torch, original, a, args, kwargs):
        output = original(*args, **kwargs)
        index = self.layers_seen
        self.layers_seen += 1
        if not self._selected(index):
            return output
        record = _sdpa_record(torch, index, a, output, False)
        layer = _finish(torch, f"layer_{index:02d}", record, None, None, None, None, None, False, False)
        replaced = output.clone()
        self._estimates(torch, index, layer, replaced if replaced.dim() == 4 else replaced[None])
        return replaced

    def _on_mha(self, torch, module, name, original, args, kwargs):
        # A module's index is fixed at its first call in a pass: capture() run inside the context calls each
        # module twice (its output, then the per-head output), and both calls are that one layer.
        index = self._modules.get(id(module))
        if index is None:
            index = self._modules[id(module)] = self.layers_seen
            self.layers_seen += 1
        if not self._selected(index):
            return original(*args, **kwargs)
        result, record, layout = _mha_parts(torch, module, name, index, original, args, kwargs)
        layer = _finish(torch, f"layer_{index:02d}", record, None, None, None, None, None, False, False)
        context = record.out.clone()
        self._estimates(torch, index, layer, context)
        return (module.out_proj(layout(context)),) + tuple(result[1:])

    def _hook_layer(self, torch, index: int, spec: LayerSpec):
        """Forward hooks on the spec's q, k, v modules, and a pre-hook on its out module that replaces the
        chosen heads of its input (the per-head attention output [B, N, H·P] or [B, H, N, P])."""
        heads, kv_heads, scale, causal = self._shape
        record = _Record(f"hooks q={spec.q!r}, k={spec.k!r}, v={spec.v!r}, out={spec.out!r}")
        handles = []
        for role in ("q", "k", "v"):
            module, part = _resolve(self.model, getattr(spec, role))

            def keep(_module, _inputs, output, role=role, part=part):
                setattr(record, role, output[part] if part is not None else output)

            handles.append(module.register_forward_hook(keep))
        module, _ = _resolve(self.model, spec.out)

        def replace(_module, args):
            self.layers_seen = max(self.layers_seen, index + 1)
            if not self._selected(index):
                return None
            if record.q is None or record.k is None or record.v is None:
                raise CaptureError(f"layer_{index:02d}: the out module {spec.out!r} ran before its q, k, v "
                                   "modules: name the modules of one attention layer in its LayerSpec")
            given = args[0]
            record.out = given
            # causal=None: validation decides full or causal (capture's rule) and refuses pre-RoPE q/k.
            layer = _finish(torch, f"layer_{index:02d}", record, heads, kv_heads, scale, causal, None,
                            causal is None, True)
            per_head = given if given.dim() == 4 else given.reshape(given.shape[0], given.shape[1],
                                                                  layer.q.shape[1], -1).transpose(1, 2)
            replaced = per_head.clone()
            self._estimates(torch, index, layer, replaced)
            if given.dim() != 4:
                replaced = replaced.transpose(1, 2).reshape(given.shape)
            record.q = record.k = record.v = None
            return (replaced,) + tuple(args[1:])

        handles.append(module.register_forward_pre_hook(replace))
        return handles

    # ---- entering and leaving ------------------------------------------------------------------------------------

    def __enter__(self) -> "Substitution":
        import torch

        stack = contextlib.ExitStack()  # undoes everything below in reverse, on exit or on a failed entry
        with stack:
            interception = None
            if self._hooks is None:
                interception = stack.enter_context(_intercept(torch, self.model, lambda *a: self._on_sdpa(torch, *a),
                                                              lambda *a: self._on_mha(torch, *a)))
                mha = getattr(torch.backends, "mha", None)
                if _has_mha(torch, self.model) and hasattr(mha, "set_fastpath_enabled"):
                    before = mha.get_fastpath_enabled()  # the fused path would skip the replaced forward
                    mha.set_fastpath_enabled(False)
                    stack.callback(mha.set_fastpath_enabled, before)
            else:
                for index, spec in enumerate(self._hooks):
                    for handle in self._hook_layer(torch, index, spec):
                        stack.callback(handle.remove)

            def start(_module, _args):
                self.cases, self.layers_seen, self._modules = [], 0, {}

            def finish(_module, _args, _output):
                if interception is not None:
                    interception.check_unfused()
                    if not self.layers_seen:
                        raise _no_attention_error(torch, interception.has_sdpa)
                wanted = max(self._layers) if self._layers else 0
                if self._layers and wanted >= self.layers_seen:
                    raise ValueError(f"layer={wanted}: the forward pass ran {self.layers_seen} attention layers "
                                     f"(layer_00..layer_{max(self.layers_seen - 1, 0):02d}); pick one of those")

            stack.callback(self.model.register_forward_pre_hook(start).remove)
            stack.callback(self.model.register_forward_hook(finish).remove)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def __repr__(self) -> str:
        layers = "all" if self._layers is None else [f"layer_{i:02d}" for i in self._layers]
        heads = "all" if self._heads is None else self._heads
        return (f"attnprobe.substitute(layer={layers}, head={heads}, estimator={self.estimator!r}, seed={self.seed}, "
                f"trial={self.trial})")


def substitute(model, *, layer, head, estimator: str, seed: int = 0, hooks: Optional[Sequence[LayerSpec]] = None,
               trial: int = 0, heads: Optional[int] = None, kv_heads: Optional[int] = None,
               scale: Optional[float] = None, causal: Optional[bool] = None) -> Substitution:
    """A context manager under which the chosen heads' attention output is ``estimator``'s.

    ``layer``: an index or a name "layer_NN" (as :func:`attnprobe.capture` numbers the layers: attention calls in
    the order the forward pass makes them), a list of them, or "all". ``head``: an int, a list, or "all".
    ``estimator``: a built-in spec, e.g. "performer(M=16)" (:func:`attnprobe.estimators`). ``hooks``: None finds
    attention as capture does (``scaled_dot_product_attention`` calls and ``nn.MultiheadAttention`` modules), or
    one :class:`attnprobe.LayerSpec` per layer with ``out`` named: its input, the per-head attention output, is what
    is replaced; ``heads``, ``kv_heads``, ``scale`` and ``causal`` are then capture's (``causal=None``: validation
    chooses full or causal on every forward pass and refuses q/k taken before RoPE; give it to skip that).

    Head h of batch item b in layer L gets ``attnprobe.estimate(estimator, q, k, v, scale, seed=seed,
    trial=trial, case={"layer": L, "head": h, "batch": b}, mask=...)`` on the q, k, v that capture records for
    it (after RoPE; grouped-query kv head h // G), with the layer's own scale and mask: the draws of the CLI's
    case ``layer=L;head=h;batch=b;n=N;spec=...[;mask=causal]`` (N: the keys of the call), bit for bit what
    ``attnprobe sweep --seed SEED`` computes on a dump of that forward pass. The case id holds no dump name
    (docs/randomness.md), so these draws are that case's in any dump of the pass, ``attnprobe.sweep(layers)``'s
    "memory" included. Consequences: every forward pass, and every batch of a loss, uses the same draws for the
    same (layer, head, batch item, length); another ``seed`` or ``trial`` draws anew.

    The estimate is float32, cast to the model's dtype. The other heads and layers keep the model's output.
    Gradients do not flow through replaced heads. Exiting restores the model exactly (the wrapped function, the
    modules' forward methods, the hooks). Errors: a head or layer that does not exist, an estimator without a
    causal form on a causal layer (``ValueError``, naming what to pick), torch's fused transformer path
    (:class:`attnprobe.CaptureError`). Inside the context, ``.cases`` lists the case ids the last forward pass
    substituted.

        >>> with attnprobe.substitute(model.eval(), layer="layer_00", head=3, estimator="streaming(sink=4,recent=60)"):
        ...     loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        >>> with attnprobe.substitute(mha_model, layer=[0, 1], head="all", estimator="softmax") as s:
        ...     model(x)                        # exact attention: the model's output to rounding
        ...     s.cases[0]
        'layer=0;head=0;batch=0;n=32;spec=softmax'
    """
    return Substitution(model, layer, head, estimator, seed, trial, hooks, heads, kv_heads, scale, causal)


# ---- the change in loss -----------------------------------------------------------------------------------------

def _t975(dof: int) -> float:
    """The two-sided 95% Student t quantile with `dof` degrees of freedom: the t where the CDF reaches 0.975, by
    bisection on 0.5 + the integral of the density from 0 (Simpson's rule, 4096 panels: the density is smooth, so the
    quantile is exact to ~1e-10 for every dof, where a printed table is exact to its 3 decimals and ends at 30)."""
    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4097)
        density = np.exp(log_norm - (dof + 1) / 2 * np.log1p(x * x / dof))
        weights = np.ones(4097)
        weights[1:-1:2], weights[2:-1:2] = 4, 2
        return 0.5 + float(weights @ density) * t / (3 * 4096)

    low, high = 0.0, 1.0
    while cdf(high) < 0.975:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < 0.975 else (low, mid)
    return (low + high) / 2


@dataclasses.dataclass
class LossDelta:
    """The result of :func:`loss_delta`. ``baseline_loss``: the model's mean loss over the batches;
    ``losses[i]``: the mean loss with the heads substituted under ``seeds[i]``; ``deltas`` = losses −
    baseline; ``mean`` and ``interval`` (95% Student t over seeds; None with one seed) of the deltas;
    ``perplexity`` (exp of the baseline loss), ``perplexity_deltas`` (exp(loss) − perplexity per seed) and
    ``perplexity_mean``. ``str()`` prints a short report."""

    estimator: str
    layer: Any
    head: Any
    seeds: List[int]
    baseline_loss: float
    losses: List[float]
    deltas: List[float]
    mean: float
    interval: Optional[tuple]
    perplexity: float
    perplexity_deltas: List[float]
    perplexity_mean: float
    batches: int

    def __str__(self) -> str:
        spread = "" if self.interval is None else f", 95% interval [{self.interval[0]:+.4g}, {self.interval[1]:+.4g}]"
        lines = [f"loss_delta: {self.estimator} on layer {self.layer}, head {self.head}, {self.batches} batches, "
                 f"{len(self.seeds)} seeds",
                 f"  baseline loss {self.baseline_loss:.6g} (perplexity {self.perplexity:.6g})",
                 f"  Δloss mean {self.mean:+.4g}{spread}; Δperplexity mean {self.perplexity_mean:+.4g}"]
        lines += [f"  seed {s}: loss {l:.6g}, Δloss {d:+.4g}, Δperplexity {p:+.4g}"
                  for s, l, d, p in zip(self.seeds, self.losses, self.deltas, self.perplexity_deltas)]
        return "\n".join(lines)


def loss_delta(model, batches: Iterable, loss_fn: Callable, *, layer, head, estimator: str,
               seeds: Iterable[int] = (0,), trial: int = 0, hooks: Optional[Sequence[LayerSpec]] = None,
               **options) -> LossDelta:
    """The change in mean loss (and perplexity) over held-out ``batches`` when the chosen heads are
    ``estimator``'s (:func:`substitute`), once per seed, with the mean and a 95% interval over seeds.

    ``batches``: inputs as :func:`attnprobe.capture` takes them (a tensor, a tuple of arguments, a dict, or a
    callable); ``loss_fn(model, batch)`` runs the model on one batch and returns its mean loss (a scalar, e.g.
    the mean token cross-entropy, in nats, so that exp(loss) is the perplexity). The mean loss is the mean of the
    batches' losses. The baseline runs once; each seed runs every batch under ``substitute(model, layer=layer,
    head=head, estimator=estimator, seed=seed, trial=trial, hooks=hooks, **options)``. Runs without gradients
    (with autograd on where that is how torch's fused MultiheadAttention path is avoided); call ``model.eval()``
    first. Substituting ``"softmax"`` (exact attention) gives Δloss 0 to float32 rounding, a check of the setup.

        >>> def loss_fn(model, batch):
        ...     x, y = batch
        ...     return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        >>> report = attnprobe.loss_delta(model.eval(), held_out, loss_fn, layer=0, head="all",
        ...                               estimator="performer(M=8)", seeds=range(4))
        >>> print(report)
        loss_delta: performer(M=8) on layer 0, head all, 8 batches, 4 seeds
          baseline loss 2.31 (perplexity 10.07)
          Δloss mean +0.41, 95% interval [+0.32, +0.50]; Δperplexity mean +5.1
          ...
        >>> report.mean, report.interval
    """
    import torch

    batches = list(batches)
    seeds = [int(s) for s in seeds]
    if not batches:
        raise ValueError("batches is empty: give the held-out inputs, e.g. a list of (x, y) pairs")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed, e.g. seeds=(0,) or seeds=range(5)")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable loss_fn(model, batch) -> scalar mean loss")

    def mean_loss() -> float:
        total = 0.0
        with _unfused(torch, _has_mha(torch, model)):
            for i, batch in enumerate(batches):
                loss = loss_fn(model, batch)
                value = float(loss.detach()) if torch.is_tensor(loss) else float(loss)
                if not math.isfinite(value):
                    raise ValueError(f"loss_fn returned {value} on batch {i}: the loss must be finite")
                total += value
        return total / len(batches)

    # Bad arguments fail before any pass; the baseline runs outside the context, the model as it is.
    substitute(model, layer=layer, head=head, estimator=estimator, seed=seeds[0], trial=trial, hooks=hooks,
               **options)
    baseline = mean_loss()
    losses = []
    for seed in seeds:
        with substitute(model, layer=layer, head=head, estimator=estimator, seed=seed, trial=trial, hooks=hooks,
                        **options):
            losses.append(mean_loss())
    deltas = [x - baseline for x in losses]
    mean = float(np.mean(deltas))
    interval = None
    if len(deltas) > 1:
        half = _t975(len(deltas) - 1) * float(np.std(deltas, ddof=1)) / math.sqrt(len(deltas))
        interval = (mean - half, mean + half)
    perplexity = math.exp(baseline)
    perplexity_deltas = [math.exp(x) - perplexity for x in losses]
    return LossDelta(str(estimator), layer, head, seeds, baseline, losses, deltas, mean, interval, perplexity,
                     perplexity_deltas, float(np.mean(perplexity_deltas)), len(batches))
