"""The one autograd factory: every differentiable op's custom ops, eager Function and per-call path, from its launchers.

A family gives two launchers (forward, backward: tensors in, tensors out; an absent output is an empty tensor,
since custom ops cannot return None), their fakes (the outputs' shapes and dtypes, for torch.compile), and two
small functions: ``save(ctx, inputs, outputs)`` keeps what the backward reads, and
``gradients(ctx, grad_outputs, backward)`` returns the gradients of the leading inputs (the rest are None),
computed with ``backward``: the backward launcher in eager mode, its custom op under torch.compile. Gradients of
unused outputs arrive as None (no zero tensors are made for them). :func:`differentiable_op` builds from these:

- ``tritonkit::<name>_fwd`` and ``tritonkit::<name>_bwd``, torch custom ops with fake implementations and the
  forward's autograd registered: what torch.compile traces, with no graph break;
- an ``autograd.Function`` over the same launchers, eager mode's path (a custom-op call costs ~45 µs more of
  host time on the H200's host: benchmarks/host_overhead.py);

and :class:`DifferentiableOp` picks per call: the custom op while torch.compile traces (:func:`tracing`), the Function
when an input requires grad, else the inference launcher (the forward, or a cheaper one that skips what only a backward
reads).
An op that cannot hold its promise under torch.compile (a backward that overwrites its input) is built eager-only:
under torch.compile it traces as a custom op whose run raises ValueError, instead of being silently ignored.

The custom ops' schemas come from the launchers' type hints: their parameters without defaults are the op's
arguments; parameters with defaults (``plan=``, the inference path's options) keep them inside the op.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

_TRACED_TENSORS = (FakeTensor, FunctionalTensor)  # tensors without data: a trace, not a run

Save = Callable[[Any, tuple, tuple], None]
Gradients = Callable[[Any, tuple, Callable], Sequence]


@dataclass(frozen=True)
class DifferentiableOp:
    """One op's three equivalent paths, chosen per call by :meth:`__call__`."""

    name: str
    function: type[torch.autograd.Function]
    inference: Callable
    forward_op: Any  # the torch custom ops; an eager-only op's forward raises compile_error when it runs
    backward_op: Any | None
    compile_error: str | None = None

    def __call__(self, *args):
        if tracing(args):
            return self.forward_op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self.function.apply(*args)
        return self.inference(*args)


def differentiable_op(
    name: str,
    *,
    forward: Callable,
    forward_fake: Callable,
    save: Save,
    gradients: Gradients,
    backward: Callable | None = None,
    backward_fake: Callable | None = None,
    non_differentiable: tuple[int, ...] = (),
    inference: Callable | None = None,
    compile_error: str | None = None,
) -> DifferentiableOp:
    """Build the op ``name`` (see the module docstring).

    ``non_differentiable``: indices of outputs no gradient flows from (statistics, saved intermediates).
    ``backward=None``: the op is its own backward (its gradients call the op itself, so a double backward works).
    ``compile_error``: build the op eager-only; a compiled call raises ValueError with this message when it runs.
    """
    eager_backward: Callable = backward if backward is not None else (lambda *args: op(*args))
    function = _function(name, forward, eager_backward, save, gradients, non_differentiable)
    backward_op = None
    if compile_error is not None:
        forward_op = _refusing_op(f"tritonkit::{name}_fwd", forward, forward_fake, compile_error)
    else:
        self_adjoint = backward is None
        forward_op = _custom_op(f"tritonkit::{name}" if self_adjoint else f"tritonkit::{name}_fwd", forward,
                                forward_fake)  # fmt: skip
        if not self_adjoint:
            backward_op = _custom_op(f"tritonkit::{name}_bwd", backward, backward_fake)
        compiled_backward = forward_op if self_adjoint else backward_op

        def setup_context(ctx, inputs, output):
            _remember(ctx, save, inputs, output if isinstance(output, tuple) else (output,), non_differentiable)

        def custom_op_backward(ctx, *grad_outputs):
            return _padded(ctx, gradients(ctx, grad_outputs, compiled_backward))

        forward_op.register_autograd(custom_op_backward, setup_context=setup_context)
    op = DifferentiableOp(name, function, inference or forward, forward_op, backward_op, compile_error)
    return op


@dataclass(frozen=True)
class InferenceOp:
    """A forward-only op: its custom op while torch.compile traces (what the graph holds), its launcher otherwise
    (eager calls skip the custom op's dispatch, tens of µs of host time)."""

    name: str
    launcher: Callable
    op: Any

    def __call__(self, *args):
        if tracing(args):
            return self.op(*args)
        return self.launcher(*args)


def tracing(args: Sequence) -> bool:
    """Whether this call is being traced rather than run: torch.compile's dynamo, or a trace of tensors without
    data (AOTAutograd tracing a custom op's backward with fake or functional tensors, where torch 2.11's
    ``is_compiling()`` is False) or under make_fx's proxy mode. The custom op then, never a kernel launch."""
    if torch.compiler.is_compiling() or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None:
        return True
    return any(isinstance(a, _TRACED_TENSORS) for a in args)


def inference_op(name: str, *, launcher: Callable, fake: Callable, mutates: tuple[str, ...] = ()) -> InferenceOp:
    """The forward-only op ``tritonkit::<name>`` over ``launcher`` (schema from its hints, as differentiable ops'),
    with ``fake`` for torch.compile; ``mutates``: the arguments it writes in place (an in-place op returns None)."""
    return InferenceOp(name, launcher, _custom_op(f"tritonkit::{name}", launcher, fake, mutates_args=mutates))


def _remember(ctx, save: Save, inputs: tuple, outputs: tuple, non_differentiable: tuple[int, ...]) -> None:
    ctx.tritonkit_inputs = len(inputs)
    save(ctx, inputs, outputs)
    if non_differentiable:
        ctx.mark_non_differentiable(*(outputs[i] for i in non_differentiable))
    # No zero gradients for unused outputs: autograd's zeros cost a fill launch each from its backward thread, ~200
    # µs of host time per step on the H200's host (torch.profiler), more than the rest of a small step.
    ctx.set_materialize_grads(False)


def needed(grads: Sequence, needs: Sequence[bool]) -> tuple:
    """A backward launcher's gradients with None where ``needs`` says the input needs none (the launcher returned an
    empty tensor there)."""
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))


def _padded(ctx, grads: Sequence) -> tuple:
    """One gradient per input: the family's gradients of the leading inputs, then None."""
    grads = tuple(grads)
    return grads + (None,) * (ctx.tritonkit_inputs - len(grads))


def _function(name, forward, backward, save, gradients, non_differentiable) -> type[torch.autograd.Function]:
    def forward_fn(ctx, *inputs):
        outputs = forward(*inputs)
        _remember(ctx, save, inputs, outputs if isinstance(outputs, tuple) else (outputs,), non_differentiable)
        return outputs

    def backward_fn(ctx, *grad_outputs):
        return _padded(ctx, gradients(ctx, grad_outputs, backward))

    title = "".join(part.title() for part in name.split("_"))
    return type(f"{title}Function", (torch.autograd.Function,),
                {"forward": staticmethod(forward_fn), "backward": staticmethod(backward_fn)})  # fmt: skip


def _schema_type(hint):
    """A type hint as torch.library's schema inference reads it: ``X | None`` as ``Optional[X]``."""
    if typing.get_origin(hint) is types.UnionType:
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        return Optional[arms[0]] if len(arms) == 1 else hint  # noqa: UP045 (torch.library reads typing.Optional)
    return hint


def _refusing_op(qualname: str, launcher: Callable, fake: Callable, message: str):
    """An eager-only op's stand-in under torch.compile: a custom op with the launcher's schema and fake, so that
    tracing goes through, and whose run raises ValueError(message). Raising while dynamo traces would not reach the
    caller: dynamo turns it into a graph break and runs the call eagerly, or, under fullgraph, into an error of its
    own."""

    def refuse(*args, **kwargs):
        raise ValueError(message)

    op = _custom_op(qualname, launcher, fake, implementation=refuse)
    # Traced but never run (the forward raises first): no gradient, so that tracing the backward raises nothing.
    op.register_autograd(lambda ctx, *grads: (None,) * ctx.tritonkit_inputs, setup_context=_count_inputs)
    return op


def _count_inputs(ctx, inputs, output) -> None:
    ctx.tritonkit_inputs = len(inputs)


def _custom_op(qualname: str, launcher: Callable, fake: Callable, implementation: Callable | None = None,
               mutates_args: tuple[str, ...] = ()):  # fmt: skip
    """``launcher`` as the torch custom op ``qualname`` (running ``implementation`` in its place when given): its
    parameters without defaults, typed by its hints; ``mutates_args``: those it writes in place."""
    hints = typing.get_type_hints(launcher)
    parameters = [
        parameter.replace(annotation=_schema_type(hints[parameter.name]))
        for parameter in inspect.signature(launcher).parameters.values()
        if parameter.default is inspect.Parameter.empty
    ]

    def run(*args, **kwargs):
        return (implementation or launcher)(*args, **kwargs)

    returns = hints["return"]
    returns = None if returns is type(None) else returns  # an in-place op: torch's schema wants None itself
    run.__signature__ = inspect.Signature(parameters, return_annotation=returns)
    run.__name__ = qualname.split("::")[1]
    op = torch.library.custom_op(qualname, run, mutates_args=mutates_args)
    op.register_fake(fake)
    return op
