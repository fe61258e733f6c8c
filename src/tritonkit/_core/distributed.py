"""DTensor inputs: an op runs on each rank's shard where its math allows, and refuses by name what it cannot take.

tritonkit's kernels read plain tensors. A DTensor (``torch.distributed.tensor``: tensor parallelism, sequence
parallelism, FSDP2's sharded parameters) is a global tensor of which each rank holds a local piece, described per
mesh dimension by a placement: ``Shard(d)`` (split along dimension d), ``Replicate()`` (whole on every rank) or
``Partial()`` (a sum still pending). The rule :func:`local_shards` applies:

- Every dimension of an op's input has an axis name (a norm's ``x`` has ``row dim 0``, ``row dim 1``, ... and
  ``features``; RoPE's ``q`` has ``batch``, ``heads``, ``tokens`` and ``head_dim``). An op computes each entry of
  most axes on its own (rows, tokens, heads): an input split along one of those is computed shard by shard, with no
  communication, and the outputs get the input's placements. The axes an op computes across (``whole``: the
  normalised features, the rotated head_dim) must be whole on every rank: a ``Shard`` there raises ValueError naming
  the argument, the placement and the mesh dimension, as does a ``Partial`` (a norm of a pending sum is not the sum
  of norms).
- On one mesh dimension, all inputs split along the same axis or are replicated; an input without that axis (a
  norm's weight, broadcast over the rows) must be ``Replicate()``, and its gradient is then a ``Partial()`` sum of
  the ranks' shares, which DTensor reduces where the gradient is used (as for torch's own ops under sequence
  parallelism).
- Plain tensors beside DTensors are this rank's local values. One that requires grad is refused (its gradient
  would be this rank's share only, silently); constants (RoPE's tables) are taken as given.

Inputs without DTensors go straight to the op (one type check per argument). FSDP2 needs none of this: inside a
module's forward its parameters are plain tensors (gathered), and activations are plain tensors.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

Axes = Callable[[Mapping[str, object]], Mapping[str, tuple[str, ...]]]


_DTENSOR: list = []  # torch's DTensor class, once torch.distributed.tensor is imported


def dtensor_class() -> type | None:
    """torch's DTensor class, or None while ``torch.distributed.tensor`` is not imported (then no DTensor exists, and
    importing it, ~0.1 s, is left to whoever makes one) or torch has no distributed support."""
    if not _DTENSOR:
        module = sys.modules.get("torch.distributed.tensor")
        if module is None:
            return None
        _DTENSOR.append(module.DTensor)
    return _DTENSOR[0]


def is_dtensor(value) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(value, cls)


def _any_dtensor(values) -> bool:
    """Whether any of ``values`` is a DTensor: by type (isinstance on a tensor class costs ~1 µs of host each)."""
    cls = dtensor_class()
    return cls is not None and any(issubclass(type(value), cls) for value in values)


def describe(placement) -> str:
    """A placement as users write it: Shard(1), Replicate(), Partial(sum)."""
    return repr(placement).replace("Shard(dim=", "Shard(").replace("Partial(reduce_op=", "Partial(")


@dataclass(frozen=True)
class _Split:
    """How one mesh dimension splits the op's inputs: the axis name (None: all replicated) and who splits it."""

    axis: str | None
    by: str | None


def _split_of(op: str, mesh_dim: int, dtensors: dict, axes: Mapping, whole: frozenset) -> _Split:
    split = _Split(None, None)
    for name, tensor in dtensors.items():
        placement = tensor.placements[mesh_dim]
        if placement.is_replicate():
            continue
        if not placement.is_shard():
            raise ValueError(
                f"{op}: {name} is {describe(placement)} on mesh dimension {mesh_dim}; {op} takes Shard and Replicate "
                f"placements (reduce a pending sum first: {name}.redistribute(placements=...) with Replicate() or "
                "Shard())"
            )
        axis = axes[name][placement.dim]
        if axis in whole:
            others = [a for a in axes[name] if a not in whole]
            raise ValueError(
                f"{op}: {name} is {describe(placement)} on mesh dimension {mesh_dim}, which splits its {axis}; {op} "
                f"computes across {axis}, so it must be whole on every rank (redistribute {name} to Replicate() "
                f"there, or shard it along one of: {', '.join(others) or 'none'})"
            )
        if split.axis is not None and split.axis != axis:
            raise ValueError(
                f"{op}: on mesh dimension {mesh_dim}, {split.by} is split along its {split.axis} but {name} along its "
                f"{axis}; the inputs must be split alike"
            )
        split = _Split(axis, name)
    return split


def _local_placement(op: str, mesh_dim: int, name: str, tensor, axes: tuple, split: _Split):
    """Check ``tensor``'s placement on ``mesh_dim`` against the split; return its gradient's placement."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    placement = tensor.placements[mesh_dim]
    if split.axis is None:
        return placement
    dims = [dim for dim, axis in enumerate(axes) if axis == split.axis and tensor.shape[dim] > 1]
    if dims:
        if placement != Shard(dims[0]):
            raise ValueError(
                f"{op}: {split.by} is split along its {split.axis} on mesh dimension {mesh_dim}, so "
                f"{name} must be too (Shard({dims[0]})), got {describe(placement)}"
            )
        return placement
    if not placement.is_replicate():
        raise ValueError(
            f"{op}: {name} has no {split.axis} to split (it is broadcast over it), so it must be "
            f"Replicate() on mesh dimension {mesh_dim}, got {describe(placement)}"
        )
    return Partial() if tensor.requires_grad else Replicate()  # each rank holds its shard's share of the gradient


def _to_local(op: str, arguments: dict, axes: Mapping, whole: frozenset, outputs: tuple) -> tuple:
    """The arguments with DTensors replaced by their local shards (gradients placed as the module docstring says),
    and the DTensor each output takes its placements from."""
    cls = dtensor_class()
    dtensors = {name: value for name, value in arguments.items() if name in axes and isinstance(value, cls)}
    first_name, first = next(iter(dtensors.items()))
    for name in axes:
        value = arguments.get(name)
        if isinstance(value, torch.Tensor) and not isinstance(value, cls):
            if value.requires_grad and torch.is_grad_enabled():
                raise TypeError(
                    f"{op}: {first_name} is a DTensor but {name} is a plain torch.Tensor that requires grad: its "
                    f"gradient would be this rank's share only; pass {name} as a DTensor on {first_name}'s mesh "
                    "(DTensor.from_local or distribute_tensor)"
                )
        elif name in dtensors and value.device_mesh != first.device_mesh:
            raise ValueError(f"{op}: {first_name} and {name} are DTensors on different device meshes")
    for name in outputs:
        if name not in dtensors:
            raise TypeError(f"{op}: {first_name} is a DTensor, so {name} must be one too (on the same mesh)")
    splits = [_split_of(op, d, dtensors, axes, whole) for d in range(first.device_mesh.ndim)]
    local = dict(arguments)
    for name, tensor in dtensors.items():
        grads = [_local_placement(op, d, name, tensor, axes[name], split) for d, split in enumerate(splits)]
        local[name] = tensor.to_local(grad_placements=grads)
    return local, [dtensors[name] for name in outputs]


def _dense_strides(local: torch.Tensor, shape: torch.Size) -> tuple[int, ...]:
    """Strides of a dense tensor of the global ``shape`` whose dimensions are laid out in ``local``'s order."""
    order = sorted(range(local.dim()), key=lambda dim: (local.stride(dim), -dim))
    strides, step = [0] * local.dim(), 1
    for dim in order:
        strides[dim], step = step, step * shape[dim]
    return tuple(strides)


def _as_dtensor(local: torch.Tensor, like) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=_dense_strides(local, like.shape))  # fmt: skip


def local_shards(op: str, *, axes: Axes, whole: tuple[str, ...], outputs: tuple[str, ...]):
    """Decorate the public function ``op`` to take DTensor inputs (module docstring).

    ``axes(arguments)``: for each tensor argument (by name, bound with defaults), one axis name per dimension.
    ``whole``: the axes ``op`` computes across (each other axis is computed entry by entry). ``outputs``: for each
    output, the argument whose global shape and placements it has (the last one serves any further outputs).
    """
    whole_axes = frozenset(whole)

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not _any_dtensor(args) and not _any_dtensor(kwargs.values()):
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            local, likes = _to_local(op, dict(bound.arguments), axes(bound.arguments), whole_axes, outputs)
            bound.arguments.update(local)
            result = fn(*bound.args, **bound.kwargs)
            if isinstance(result, tuple):
                return tuple(_as_dtensor(out, likes[min(i, len(likes) - 1)]) if out is not None else None
                             for i, out in enumerate(result))  # fmt: skip
            return _as_dtensor(result, likes[0])

        return wrapper

    return decorate


def row_axes(rows: tuple[str, ...], params: tuple[str, ...] = ()) -> Axes:
    """The axes of an op over the last dimension (``features``) of its ``rows`` inputs, whose leading dimensions are
    ``row dim 0``, ``row dim 1``, ... (the first input's count), with 1-D ``params`` over the features."""

    def axes(arguments):
        leading = tuple(f"row dim {i}" for i in range(getattr(arguments[rows[0]], "ndim", 1) - 1))
        return {**dict.fromkeys(rows, (*leading, "features")), **dict.fromkeys(params, ("features",))}

    return axes


def refuse_dtensors(op: str, names: tuple[str, ...], hint: str):
    """Decorate ``op`` to raise TypeError naming the first DTensor among the arguments ``names`` (with ``hint``: what
    to call instead), rather than failing inside a kernel that cannot read it."""

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _any_dtensor(args) or _any_dtensor(kwargs.values()):
                arguments = signature.bind(*args, **kwargs).arguments
                for name in names:
                    if is_dtensor(arguments.get(name)):
                        placements = ", ".join(describe(p) for p in arguments[name].placements)
                        raise TypeError(f"{op}: {name} is a DTensor ({placements}); {hint}")
            return fn(*args, **kwargs)

        return wrapper

    return decorate


# --------------------------------------------------------------------------------------------------
# Process groups and vocabulary shards (the vocabulary-parallel losses)
# --------------------------------------------------------------------------------------------------
def group_name(group) -> str:
    """The name custom ops carry a process group by (their schemas take no ProcessGroup); "" for none: a world of
    one, where no collective runs. ``group=None`` means the default group when torch.distributed is initialised."""
    if group is None:
        if not torch.distributed.is_available() or not torch.distributed.is_initialized():
            return ""
        group = torch.distributed.group.WORLD
    if torch.distributed.get_world_size(group) == 1:
        return ""
    return group.group_name


def resolve_group(name: str):
    """The process group of :func:`group_name`'s ``name`` (None for "")."""
    if not name:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def group_size(name: str) -> int:
    """The size of the group :func:`group_name` named ``name`` (1 for "", a world of one)."""
    return torch.distributed.get_world_size(resolve_group(name)) if name else 1


def group_rank_and_size(group) -> tuple[int, int]:
    """This rank's index in ``group`` and the group's size ((0, 1) for a world of one)."""
    if not group_name(group):
        return 0, 1
    group = group if group is not None else torch.distributed.group.WORLD
    return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)


def all_reduce(tensor: torch.Tensor, op: str, group_name_: str) -> torch.Tensor:
    """In place over the named group ("sum" or "max"); nothing for a world of one."""
    if group_name_:
        reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
        torch.distributed.all_reduce(tensor, op=reduce_op, group=resolve_group(group_name_))
    return tensor


@dataclass(frozen=True)
class ShardedDim:
    """Where one dimension of a DTensor is split: over ``mesh_dim`` (whose process group is ``group``), this rank
    holding entries [start, start + local) of ``size``."""

    mesh_dim: int
    group: object
    start: int
    size: int


def sharded_dim(op: str, name: str, tensor, dim: int) -> ShardedDim:
    """``tensor`` (a DTensor) must be Shard(dim) on exactly one mesh dimension and Replicate() on the others; where
    this rank's piece starts, by DTensor's rule (torch.chunk's: pieces of ceil(size / ranks), the last ones shorter
    or empty)."""
    dim = dim % tensor.dim()
    shards = [d for d, p in enumerate(tensor.placements) if p.is_shard()]
    others = [(d, p) for d, p in enumerate(tensor.placements) if not p.is_replicate() and d not in shards]
    if len(shards) != 1 or tensor.placements[shards[0]].dim != dim or others:
        placements = ", ".join(describe(p) for p in tensor.placements)
        raise ValueError(
            f"{op}: {name} must be Shard({dim}) on one mesh dimension and Replicate() on the others, got ({placements})"
        )
    mesh_dim = shards[0]
    mesh = tensor.device_mesh
    ranks, coordinate = mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim)
    size = tensor.shape[dim]
    piece = -(-size // ranks)
    start = min(piece * coordinate, size)
    if tensor.to_local().shape[dim] != min(piece, size - start):
        raise ValueError(f"{op}: {name}'s local shape {tuple(tensor.to_local().shape)} is not DTensor's even split "
                         f"of {tuple(tensor.shape)}")  # fmt: skip
    return ShardedDim(mesh_dim, mesh.get_group(mesh_dim), start, size)
