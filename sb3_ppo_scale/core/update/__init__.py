"""One ``train()``, in the order a logical minibatch flows (docs/design.md follows one through):

:mod:`~.rollout` (the rollout staged on the training device once) -> :mod:`~.sampling` (logical minibatches and
their micro-batches) -> :mod:`~.objectives` (clip / KL-penalty losses; :mod:`~.kl` for the KL terms and beta) ->
:mod:`~.step` (backward per micro-batch, one gradient clip and optimizer step per logical minibatch, with
:mod:`~.gradient_ops`, :mod:`~.flat_adam` and :mod:`~.guard`) -> :mod:`~.lr` (the KL-adaptive rate after the update).
:mod:`~.graphs` replays a step from CUDA graphs; :mod:`~.compiled` is the ``torch.compile``-d loss.
"""
