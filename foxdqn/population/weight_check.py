"""The post-step weight check of a population (``guard.max_weight``, per member): each member's
Adam step is tried on a scratch copy first, and a member whose weights it would make non-finite or
larger than its own bound is halted by the guard before the step is applied.

The post-step weight check (docs/design/guard.md#after-the-step) with a member axis: per update, after the gradients, the
clip coefficient and a learning-rate spike (``debug.inject_lr_spike_at_step``) are known and before
the guard, one ``torch._foreach_copy_`` copies the parameters, both moments and the step counts of
:class:`~foxdqn.population.optim.MemberAdam` into scratch tensors, the same Adam op
(:func:`foxdqn.ops.adam_step.adam_step_` with ``members=P``, the optimizer's own ``[P]`` lr and ε
tensors) steps the copy with no member skipped, and each member's largest |w| of the result is the
integer max of the float bit patterns with the sign cleared (+Inf above every finite value, every NaN
above +Inf; exact and independent of the order
of reduction, so member p's value does not depend on P). The guard
(:meth:`foxdqn.population.member_guard.MemberGuard.check`) halts member p when that value is not
<= its ``guard.max_weight`` (off for a member whose bound is 0 or null). The real step runs the same
op on the same inputs, so the weights it writes for a member that is not skipped are the ones that
were checked, bit for bit.

Cost with some member's check on: the copy, the trial Adam (one launch per 16 tensors on CUDA) and
two small reductions per parameter tensor, with scratch memory of three times the parameters. Without
it nothing of this exists. Device ops only (capturable).
"""
from __future__ import annotations

import torch

from foxdqn.ops.adam_step import adam_step_
from foxdqn.population.optim import MemberAdam


class MemberWeightCheck:
    """Trial Adam step of every member on scratch copies and each member's max |w| after it.

    Args:
        optimizer: the population's :class:`~foxdqn.population.optim.MemberAdam`.

    Attributes:
        weights, exp_avgs, exp_avg_sqs: scratch tensors shaped like the parameters; steps: float32
        ``[P]`` scratch step counts; never: float32 ``[P]`` zeros (the trial skips no member).
    """

    def __init__(self, optimizer: MemberAdam) -> None:
        self.optimizer = optimizer
        self.members = optimizer.members
        self.weights = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in optimizer.params]
        self.exp_avgs = [torch.zeros_like(p) for p in self.weights]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.weights]
        self.steps = torch.zeros_like(optimizer.steps)
        self.never = torch.zeros_like(optimizer.steps)

    @torch.no_grad()
    def run(self, grad_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Each member's largest |w| after the Adam step the optimizer would take now (float32
        ``[P]``: +Inf or NaN where some weight would not be finite), from the params' grads and
        the clip coefficient ``grad_scale`` (float32 ``[P]`` or None). Device ops only."""
        o, p = self.optimizer, self.members
        torch._foreach_copy_([*self.weights, *self.exp_avgs, *self.exp_avg_sqs, self.steps],
                             [*(w.detach() for w in o.params), *o.exp_avg, *o.exp_avg_sq, o.steps])
        beta1, beta2 = o.betas
        adam_step_(self.weights, [w.grad for w in o.params], self.exp_avgs, self.exp_avg_sqs, [self.steps],
                   lr=o.lr, beta1=beta1, beta2=beta2, eps=o.eps, grad_scale=grad_scale, skip=self.never,
                   members=p, backend=o.backend)
        bits = [w.view(p, -1).view(torch.int32).bitwise_and(0x7FFFFFFF).amax(dim=1) for w in self.weights]
        return torch.stack(bits).amax(dim=0).view(torch.float32)
