"""Fused projection copies for `LeanModel`: several projections of one input as one matmul.

`Fused` runs projections that read the same input (q/k/v; gate/up) as one matmul over a copy of
their weights stacked along the output dimension: one op instead of three (two), and q, k and v
come out side by side, so one rotary pass covers q and k and one cache write k and v. `rows`,
when given, reorders the stacked output rows (q/k into "pairs" order) in the copy. The copy is
kept transposed ([in, out]): `x @ W_t` is a little faster than `F.linear` at decode sizes (and
bit for bit the same), which is also why o and down get a copy of their own.

A projection may be a plain `nn.Linear` or a peft LoRA layer over one (`lora_terms`): the copy
is then of its base layer's weight, and its active adapters run beside it as one low-rank pass
for all the stacked projections (`LowRank`: x @ A_t @ B_t, the A's stacked, the B's as a block
diagonal), added as peft adds them (the base output plus B(A(x)) * scaling in the adapters'
dtype, cast back to the base's). Called as modules instead, peft's layers cost a steady ~60 us of
Python each, four to seven per decoder layer: measured on SmolLM2-135M with LoRA on q/k/v/o
(16 rows, bfloat16, 2 cores), they were ~30% of an RL step's decode. A layer whose adapters are
not plain LoRA (DoRA and other variants, a LoRA bias, dropout while training, disabled adapters
over merged weights, `fan_in_fan_out`) is not fused: it is called as a module.

The copies are remade whenever a source changes: `stale` compares each base weight and bias and
each adapter weight (the current objects and their version counters, bumped by every in-place
update: an optimizer step, `load_weights_in_place`'s `copy_`) and the set of active adapters
with those the copy was made from, once per forward. The base copy and the low-rank one are
remade separately: an optimizer step on the adapters re-copies the adapters alone. Writes through
`.data` (and to inference tensors) move no version counter: `LocalClient` builds a new
`LeanModel`, which copies afresh, after any weight change made under its `exclusive_weights()`.
"""

from __future__ import annotations

from typing import Any

# (A, B, scaling) of one active LoRA adapter of a projection: y += B(A(x)) * scaling
Term = tuple[Any, Any, float]
# (module._parameters, name, tensor, version) of one base weight or bias a copy was made from
Source = tuple[dict[str, Any], str, Any, int]


def lora_terms(module: Any) -> list[Term] | None:
    """How `module` runs as a base `nn.Linear` plus low-rank terms: [] for a plain `nn.Linear`
    (or a LoRA layer whose adapters are all off, or merged into its base), its active adapters'
    terms for a plain LoRA layer, None for anything else (called as a module)."""
    import torch

    if type(module) is torch.nn.Linear:
        return []
    base = _lora_base(module)
    if base is None or getattr(module, "fan_in_fan_out", False):
        return None
    if not getattr(module, "cast_input_dtype_enabled", True):
        return None
    if module.disable_adapters:
        return None if module.merged else []  # peft unmerges merged weights in that case: leave it to peft
    if module.merged:
        return []  # peft runs the base alone (its weight holds the merged adapters)
    terms: list[Term] = []
    variants = getattr(module, "lora_variant", {})  # DoRA and other variants (peft >= 0.15)
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in variants or module.use_dora.get(name) or getattr(module, "lora_bias", {}).get(name):
            return None
        dropout = module.lora_dropout[name]
        if not isinstance(dropout, torch.nn.Identity) and dropout.training:
            return None
        a, b = module.lora_A[name], module.lora_B[name]
        if not (type(a) is torch.nn.Linear and type(b) is torch.nn.Linear) or a.bias is not None:
            return None
        if b.bias is not None or a.weight.dtype != b.weight.dtype:
            return None
        terms.append((a, b, float(module.scaling[name])))
    return terms


def _lora_base(module: Any) -> Any | None:
    """The plain `nn.Linear` under a peft LoRA layer, or None when `module` is not one."""
    import torch

    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return None
    if not isinstance(module, LoraLayer):
        return None
    base = module.get_base_layer()
    return base if type(base) is torch.nn.Linear else None


def base_linear(module: Any) -> Any:
    """The `nn.Linear` whose weight a projection's copy holds (its base layer for a LoRA layer)."""
    import torch

    return module if type(module) is torch.nn.Linear else module.get_base_layer()


class LowRank:
    """The active LoRA adapters of stacked projections as two matmuls: `x @ A_t` [N, ranks], then
    `@ B_t` [ranks, outputs], B_t block diagonal (each projection's outputs read its own ranks:
    the zeros add nothing). One shared scaling is applied after, as peft does; projections with
    different scalings get theirs folded into their B block."""

    def __init__(self, terms: list[list[Term]], outputs: list[int], rows: Any) -> None:
        import torch

        flat = [term for module_terms in terms for term in module_terms]
        first_a = flat[0][0].weight
        ranks = sum(a.weight.shape[0] for a, _, _ in flat)
        scalings = {scaling for _, _, scaling in flat}
        self.scaling: float | None = scalings.pop() if len(scalings) == 1 else None
        with torch.no_grad():
            a_t = torch.cat([a.weight for a, _, _ in flat]).t().contiguous()
            b = first_a.new_zeros((sum(outputs), ranks))
            row, column = 0, 0
            for module_terms, count in zip(terms, outputs):
                for a, b_module, scaling in module_terms:
                    rank = a.weight.shape[0]
                    block = b_module.weight if self.scaling is not None else b_module.weight * scaling
                    b[row : row + count, column : column + rank] = block
                    column += rank
                row += count
            if rows is not None:
                b = b[rows]
        self.a_t, self.b_t = a_t, b.t().contiguous()
        self.dtype = a_t.dtype

    def add_to(self, y: Any, x: Any) -> Any:
        """`y` (the base output) plus the adapters' output, in the adapters' dtype, cast back."""
        low = (x if x.dtype == self.dtype else x.to(self.dtype)).mm(self.a_t).mm(self.b_t)
        if self.scaling is not None:
            low.mul_(self.scaling)
        total = y + low
        return total if total.dtype == y.dtype else total.to(y.dtype)


class Fused:
    """Projections of one input as one matmul over a copy of their stacked (base) weights, plus
    their active LoRA adapters as one low-rank pass (see the module docstring)."""

    def __init__(self, modules: list[Any], rows: Any = None) -> None:
        self.modules = modules
        self.rows = rows
        self.weight_t: Any = None  # [in, out]: a plain (NN) matmul is a little faster than x @ W.t()
        self.bias: Any = None
        self.low_rank: LowRank | None = None
        self._base_sources: list[Source] = []
        self._lora_sources: list[tuple[Any, int]] = []  # (adapter weight, version), in `terms` order
        self._lora_key: list[tuple[Any, ...]] = []  # `_key`: which adapters run, which are merged
        self.refresh()

    @staticmethod
    def applies(modules: list[Any]) -> bool:
        if any(lora_terms(m) is None for m in modules):
            return False
        bases = [base_linear(m) for m in modules]
        return (
            len({(b.weight.shape[1], b.weight.dtype, b.weight.device) for b in bases}) == 1
            and len({b.bias is None for b in bases}) == 1
        )

    def stale(self) -> bool:
        terms = [lora_terms(m) for m in self.modules]
        if any(t is None for t in terms):
            return True  # a projection peft must run itself now (the caller unfuses)
        known = [t or [] for t in terms]
        return self._base_stale() or self._switched(known) or self._adapters_moved(known)

    def refresh(self) -> None:
        terms = self._terms()
        # Adapters switched, merged or unmerged: peft merges through `.data`, which moves no
        # version counter, so the base is re-copied too (rare: adapter steps re-copy them alone).
        switched = self._switched(terms)
        if self.weight_t is None or switched or self._base_stale():
            self._copy_base()
        if switched or self._adapters_moved(terms):
            self._copy_low_rank(terms)

    def __call__(self, x: Any) -> Any:
        import torch

        y = torch.mm(x, self.weight_t) if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        return y if self.low_rank is None else self.low_rank.add_to(y, x)

    def _terms(self) -> list[list[Term]]:
        return [lora_terms(m) or [] for m in self.modules]

    def _base_stale(self) -> bool:
        # `_parameters` directly: nn.Module.__getattr__ would cost more than the check itself.
        return any(
            params.get(name) is not tensor or _version(tensor) != version
            for params, name, tensor, version in self._base_sources
        )

    def _switched(self, terms: list[list[Term]]) -> bool:
        """Whether other adapters run now, or other projections hold merged ones, than when copied."""
        return _key(self.modules, terms) != self._lora_key

    def _adapters_moved(self, terms: list[list[Term]]) -> bool:
        """Whether an adapter weight (of the same adapters) was replaced or updated in place."""
        flat = [term for module_terms in terms for term in module_terms]
        weights = [w for a, b, _ in flat for w in (a.weight, b.weight)]
        return any(
            w is not made or _version(w) != version for w, (made, version) in zip(weights, self._lora_sources)
        )

    def _copy_base(self) -> None:
        import torch

        bases = [base_linear(m) for m in self.modules]
        with torch.no_grad():
            weight = torch.cat([b.weight for b in bases])
            self.bias = None if bases[0].bias is None else torch.cat([b.bias for b in bases])
            if self.rows is not None:
                weight = weight[self.rows]
                self.bias = None if self.bias is None else self.bias[self.rows]
            self.weight_t = weight.t().contiguous()
        self._base_sources = [
            (b._parameters, name, b._parameters.get(name), _version(b._parameters.get(name)))
            for b in bases
            for name in ("weight", "bias")
        ]

    def _copy_low_rank(self, terms: list[list[Term]]) -> None:
        flat = [term for module_terms in terms for term in module_terms]
        outputs = [base_linear(m).weight.shape[0] for m in self.modules]
        self.low_rank = LowRank(terms, outputs, self.rows) if flat else None
        self._lora_key = _key(self.modules, terms)
        self._lora_sources = [(w, _version(w)) for a, b, _ in flat for w in (a.weight, b.weight)]


def _key(modules: list[Any], terms: list[list[Term]]) -> list[tuple[Any, ...]]:
    """Which adapters run, by identity ((id(A), id(B), scaling) of every term, in order), and
    which projections hold merged adapters in their base weight."""
    merged = tuple(bool(getattr(m, "merged", False)) for m in modules)
    return [merged, *((id(a), id(b), scaling) for module_terms in terms for a, b, scaling in module_terms)]


def _version(tensor: Any) -> int:
    """A tensor's version counter (-1 for None, and for inference tensors, which have none)."""
    return -1 if tensor is None or tensor.is_inference() else tensor._version
