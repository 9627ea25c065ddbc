"""One collection step's policy call, ``policy(obs)``, without SB3's per-call overhead and with the same numbers.

SB3's ``ActorCriticPolicy.forward`` goes through a dozen ``nn.Module.__call__`` dispatches, builds a torch
``Distribution`` (with argument validation) and then samples from it and scores the sample. On a small MLP and one
env that costs several times the ops themselves. :class:`FusedActorCritic` runs the *same* tensor operations, in
the same order, with the same random-number draws, straight from the policy's own parameters:

- features: SB3's ``preprocess_obs``, then ``flatten(1)`` for a ``FlattenExtractor`` (the extractor module
  otherwise);
- the actor and critic MLPs: each layer of ``mlp_extractor.policy_net`` / ``value_net`` called directly
  (``F.linear`` on the layer's own weight and bias; other layers through their ``forward``);
- the distribution: a :class:`ActionSampler` per SB3 distribution, doing what torch's ``Normal`` /
  ``Categorical`` / ``Bernoulli`` do in ``sample`` and ``log_prob`` (the standard-normal draws ``torch.normal``
  makes, scaled and shifted as it does; ``torch.multinomial`` and ``torch.bernoulli`` on the same inputs). Quantities that depend only on parameters (the Gaussian's standard
  deviation, its log and its doubled variance) are computed once per rollout, with the same operations.

sb3-contrib's ``MaskableActorCriticPolicy`` family is fused the same way: ``policy(obs, action_masks=masks)`` is
reproduced by the masked samplers (the logits normalised, masked to -1e8, normalised again, as ``MaskableCategorical``
does, whether or not masks are given).

Every output is bit-identical to ``policy(obs)`` and leaves the torch RNG in the same state; tests/test_lean_collect.py
proves it per action space (tests/test_contrib_maskable.py for the masked policies). Distributions without a fused sampler (gSDE) use the policy's own distribution object;
:func:`fusion_blocker` names what makes a policy unsafe to fuse (a custom policy class or forward, module hooks,
installed SB3 / sb3-contrib / torch code other than the verified one: :mod:`sb3_ppo_scale.core.exact.upstream`), and
collection then runs SB3's loop.

The step reads the parameters at construction time by reference: build one per rollout (parameters change only
in ``train()``; an optimizer updates them in place).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import (
    MaskableBernoulliDistribution,
    MaskableCategoricalDistribution,
    MaskableMultiCategoricalDistribution,
)
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    MultiCategoricalDistribution,
)
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor

from sb3_ppo_scale.core.exact.upstream import changed_upstream, policy_step

Layer = Callable[[th.Tensor], th.Tensor]
#: log(sqrt(2 pi)), the constant torch's Normal.log_prob subtracts
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
#: The classes whose forward the fused step reproduces; a policy is fused when it is one of them or a subclass that
#: keeps every method of :data:`REPLACED_METHODS` (SB3's Cnn / MultiInput variants do).
FORWARD_CLASSES = (ActorCriticPolicy, MaskableActorCriticPolicy)
#: Methods of those classes that the fused step replaces; a subclass overriding one is not fused.
REPLACED_METHODS = ("forward", "extract_features", "_get_action_dist_from_latent")


def fusion_blocker(policy: th.nn.Module, forward_classes: tuple[type, ...] = FORWARD_CLASSES,
                   replaced: tuple[str, ...] = REPLACED_METHODS) -> str | None:
    """Why ``policy(obs)`` cannot be replaced by a fused step exactly, or None when it can.

    :param forward_classes: the classes whose forward the fused step reproduces (the first ``policy`` is an instance
        of is its reference); default :class:`FusedActorCritic`'s.
    :param replaced: the reference's methods that the fused step replaces (a subclass overriding one is refused).
    """
    reference = next((base for base in forward_classes if isinstance(policy, base)), None)
    if reference is None:
        return (f"policy class {type(policy).__name__} is not one of "
                f"{', '.join(base.__name__ for base in forward_classes)}")
    overridden = [name for name in replaced if getattr(type(policy), name) is not getattr(reference, name)]
    if overridden:
        return f"policy class {type(policy).__name__} overrides {', '.join(overridden)}"
    patched = [name for name in replaced if name in vars(policy)]
    if patched:
        return f"the policy object's {', '.join(patched)} is replaced"
    if type(policy.mlp_extractor) is not MlpExtractor:
        return f"mlp_extractor {type(policy.mlp_extractor).__name__} is not SB3's MlpExtractor"
    if th.nn.modules.module._global_forward_hooks or th.nn.modules.module._global_forward_pre_hooks:
        return "global nn.Module forward hooks are registered"
    hooked = [name for name, module in policy.named_modules() if module._forward_hooks or module._forward_pre_hooks]
    if hooked:
        return f"forward hooks on {hooked[0] or 'the policy'}"
    return changed_upstream(policy_step(reference, replaced, type(policy.action_dist)))


def direct(layer: th.nn.Module) -> Layer:
    """``layer``'s computation without ``nn.Module.__call__`` (exactly what its ``forward`` does)."""
    if type(layer) is th.nn.Linear:
        weight, bias = layer.weight, layer.bias
        return lambda x: F.linear(x, weight, bias)
    if type(layer) is th.nn.Tanh:
        return th.tanh
    if type(layer) is th.nn.ReLU and not layer.inplace:
        return th.relu
    return layer.forward


def _leaves(module: th.nn.Module) -> list[th.nn.Module]:
    """The layers an ``nn.Sequential`` (possibly nested) applies in order; any other module is one layer."""
    if type(module) is th.nn.Sequential:
        return [leaf for child in module for leaf in _leaves(child)]
    return [module]


def _chain(module: th.nn.Module) -> Layer:
    layers = [direct(leaf) for leaf in _leaves(module)]
    if not layers:
        return lambda x: x

    def run(x: th.Tensor) -> th.Tensor:
        for layer in layers:
            x = layer(x)
        return x

    return run


class PolicyParts:
    """A policy's module and parameter objects, in order, compared by identity. A fused step reads the objects it
    was built from, so once a user replaces one (``policy.value_net = nn.Linear(...)``, a new ``log_std``
    Parameter) the parts differ and the step must be built again; values changed in place need nothing."""

    __slots__ = ("objects",)

    def __init__(self, policy: th.nn.Module) -> None:
        self.objects = (*policy.modules(), *policy.parameters())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyParts) and len(self.objects) == len(other.objects) \
            and all(mine is theirs for mine, theirs in zip(self.objects, other.objects))

    __hash__ = None  # type: ignore[assignment]


# ------------------------------------------------------------------------------------------------ samplers
class ActionSampler:
    """Samples actions from the action net's output and scores them, as SB3's distribution would."""

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """(actions, log_prob) for one batch of observations."""
        raise NotImplementedError


class GaussianSampler(ActionSampler):
    """``DiagGaussianDistribution``: ``Normal(mean, ones_like(mean) * exp(log_std))``, sample, summed log_prob. The
    terms that depend on ``log_std`` only are computed again whenever its values change (a callback annealing the
    exploration noise during a rollout), as SB3 computes them at every step."""

    def __init__(self, log_std: th.Tensor) -> None:
        self.log_std = log_std
        self._rows = -1
        self._log_std_seen: th.Tensor | None = None

    def _prepare(self, mean: th.Tensor) -> None:
        """The scale and the log_prob terms that depend on parameters only, for ``len(mean)`` rows."""
        self._log_std_seen = self.log_std.detach().clone() if self.log_std.device.type == "cpu" else None
        self.scale = th.ones_like(mean) * self.log_std.exp()
        self.neg_two_var = -(2 * self.scale**2)  # -(x / d) == x / -d exactly: the negation moves into the divisor
        self.log_scale = self.scale.log()
        self.noise = th.empty_like(mean)
        self._rows = mean.shape[0]

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        if self._stale(mean_actions):
            self._prepare(mean_actions)
        return self.from_noise(self.noise.normal_(0, 1), mean_actions)  # th.normal's draws, into a reused tensor

    def _stale(self, mean_actions: th.Tensor) -> bool:
        """Whether the prepared terms are not those of ``mean_actions``' row count and ``log_std``'s values now. On a
        GPU they are always computed again: comparing would wait for the GPU at every step, computing does not."""
        if mean_actions.shape[0] != self._rows or self._log_std_seen is None:
            return True
        return not th.equal(self.log_std, self._log_std_seen)

    def from_noise(self, noise: th.Tensor, mean_actions: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """(actions, log_prob) from ``noise``, standard-normal draws shaped like ``mean_actions`` (left as they are:
        the actions are a new tensor); the scale must be prepared for ``len(mean_actions)`` rows."""
        # what th.normal(mean, scale) computes (standard normal draws, * scale, + mean), without its std >= 0 check
        actions = th.mul(noise, self.scale).add_(mean_actions)
        # Normal.log_prob: -((value - loc) ** 2) / (2 * var) - log(scale) - log(sqrt(2 pi)), in place; the quotient's
        # sign comes from the divisor (IEEE division is sign-symmetric), one op fewer than negating the square
        log_prob = (actions - mean_actions).pow_(2).div_(self.neg_two_var).sub_(self.log_scale).sub_(_LOG_SQRT_2PI)
        return actions, log_prob.sum(dim=1)


def _categorical(logits: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """torch's ``Categorical(logits=...)``: normalised logits, one multinomial draw per row, the draw's log-prob."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = F.softmax(normalized, dim=-1)
    actions = th.multinomial(probs, 1, True).T.reshape(probs.shape[:-1])
    return actions, normalized.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


class CategoricalSampler(ActionSampler):
    """``CategoricalDistribution``."""

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return _categorical(mean_actions)


def mask_logits(normalized: th.Tensor, masks: Any) -> tuple[th.Tensor, th.Tensor]:
    """sb3-contrib's ``MaskableCategorical.apply_masking(masks)`` on normalised logits: (the masks as a bool tensor
    shaped like the logits, the logits with masked entries set to -1e8). Contrib makes -1e8 with
    ``th.tensor(-1e8, dtype, device)``; a fill gives the same value without a host copy (a CUDA graph can capture
    it)."""
    allowed = th.as_tensor(masks, dtype=th.bool, device=normalized.device).reshape(normalized.shape)
    huge_neg = th.full((), -1e8, dtype=normalized.dtype, device=normalized.device)
    return allowed, th.where(allowed, normalized, huge_neg)


def _masked_categorical(logits: th.Tensor, masks: Any) -> tuple[th.Tensor, th.Tensor]:
    """sb3-contrib's ``MaskableCategorical(logits=...)`` after ``apply_masking(masks)``: the logits normalised, masked
    entries set to -1e8 (none when ``masks`` is None), then torch's ``Categorical`` on the result."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    if masks is not None:
        _, normalized = mask_logits(normalized, masks)
    return _categorical(normalized)


class MaskedCategoricalSampler(ActionSampler):
    """``MaskableCategoricalDistribution``, masked by the step's ``action_masks`` (or not, when None)."""

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor,
                 action_masks: Any = None) -> tuple[th.Tensor, th.Tensor]:
        return _masked_categorical(mean_actions, action_masks)


class MultiCategoricalSampler(ActionSampler):
    """``MultiCategoricalDistribution``: one categorical per dimension, sampled in order, log-probs summed. With
    ``masked``, sb3-contrib's ``MaskableMultiCategoricalDistribution`` (and ``MaskableBernoulliDistribution``, two
    categories per bit): the step's masks split into one block per sub-action, each sub-action masked."""

    def __init__(self, action_dims: list[int], masked: bool = False) -> None:
        self.action_dims = [int(n) for n in action_dims]
        self.masked = masked

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor,
                 action_masks: Any = None) -> tuple[th.Tensor, th.Tensor]:
        logits = th.split(mean_actions, self.action_dims, dim=1)
        if not self.masked:
            drawn = [_categorical(part) for part in logits]
        else:
            masks: Any = [None] * len(logits)
            if action_masks is not None:
                masks = th.split(th.as_tensor(action_masks).view(-1, sum(self.action_dims)), self.action_dims, dim=1)
            drawn = [_masked_categorical(part, mask) for part, mask in zip(logits, masks)]
        actions = th.stack([action for action, _ in drawn], dim=1)
        return actions, th.stack([log_prob for _, log_prob in drawn], dim=1).sum(dim=1)


class BernoulliSampler(ActionSampler):
    """``BernoulliDistribution``: ``bernoulli(sigmoid(logits))``, log-prob ``-BCE-with-logits`` summed."""

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        actions = th.bernoulli(th.sigmoid(mean_actions))
        log_prob = -F.binary_cross_entropy_with_logits(mean_actions, actions, reduction="none")
        return actions, log_prob.sum(dim=1)


class DistributionSampler(ActionSampler):
    """Any other SB3 distribution (gSDE): the policy's own distribution object, as ``forward`` uses it."""

    def __init__(self, policy: ActorCriticPolicy) -> None:
        self.policy = policy

    def __call__(self, mean_actions: th.Tensor, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        distribution = self.policy._get_action_dist_from_latent(latent_pi)
        actions = distribution.get_actions()
        return actions, distribution.log_prob(actions)


def make_sampler(policy: ActorCriticPolicy | MaskableActorCriticPolicy) -> ActionSampler:
    """The fused sampler of ``policy.action_dist`` (:class:`DistributionSampler` for any other kind)."""
    dist = policy.action_dist
    if type(dist) is DiagGaussianDistribution:
        return GaussianSampler(policy.log_std)
    if type(dist) is CategoricalDistribution:
        return CategoricalSampler()
    if type(dist) is MultiCategoricalDistribution:
        return MultiCategoricalSampler(dist.action_dims)
    if type(dist) is BernoulliDistribution:
        return BernoulliSampler()
    if type(dist) is MaskableCategoricalDistribution:
        return MaskedCategoricalSampler()
    if type(dist) in (MaskableMultiCategoricalDistribution, MaskableBernoulliDistribution):
        return MultiCategoricalSampler(dist.action_dims, masked=True)
    return DistributionSampler(policy)


# ------------------------------------------------------------------------------------------------ the step
class FusedActorCritic:
    """``policy(obs)`` (sampled actions, values, log-probs), computed without module dispatch or Distribution objects.

    :param policy: an SB3 actor-critic policy (or sb3-contrib maskable one) for which :func:`fusion_blocker` returns
        None; its parameters are read by reference, so build one per rollout.
    """

    def __init__(self, policy: ActorCriticPolicy | MaskableActorCriticPolicy) -> None:
        self.policy = policy
        self.parts = PolicyParts(policy)  #: the objects this step reads
        self.action_shape = policy.action_space.shape
        self.actor = _chain(policy.mlp_extractor.policy_net)
        self.critic = _chain(policy.mlp_extractor.value_net)
        self.action_net = direct(policy.action_net)
        self.value_net = direct(policy.value_net)
        self.sampler = make_sampler(policy)
        self._pi_features, self._vf_features = self._feature_functions(policy)

    def _feature_functions(self, policy: ActorCriticPolicy | MaskableActorCriticPolicy) -> tuple[Callable[[Any], th.Tensor], Callable[[Any], th.Tensor]]:
        """Observation -> features for the actor and for the critic (the same function when the extractor is shared)."""
        space, normalize = policy.observation_space, policy.normalize_images
        flat = isinstance(space, spaces.Box) and not (normalize and len(space.shape) == 3)

        def features_with(extractor: th.nn.Module) -> Callable[[Any], th.Tensor]:
            if type(extractor) is FlattenExtractor and type(extractor.flatten) is th.nn.Flatten and flat \
                    and (extractor.flatten.start_dim, extractor.flatten.end_dim) == (1, -1):
                return lambda obs: obs.float().flatten(1)  # preprocess_obs(Box) then nn.Flatten()
            return lambda obs: extractor(preprocess_obs(obs, space, normalize_images=normalize))

        if policy.share_features_extractor:
            shared = features_with(policy.features_extractor)
            return shared, shared
        return features_with(policy.pi_features_extractor), features_with(policy.vf_features_extractor)

    def __call__(self, obs: th.Tensor | dict[str, th.Tensor],
                 action_masks: Any = None) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """(actions, values, log_prob) as ``policy(obs)``; ``action_masks`` (a maskable policy only) as
        ``policy(obs, action_masks=action_masks)``."""
        pi_features, vf_features = self.features(obs)
        return self.heads(pi_features, vf_features, action_masks)

    def features(self, obs: th.Tensor | dict[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor]:
        """The actor's and the critic's features of ``obs`` (the same tensor when the extractor is shared)."""
        pi_features = self._pi_features(obs)
        return pi_features, pi_features if self._vf_features is self._pi_features else self._vf_features(obs)

    def heads(self, pi_latent: th.Tensor, vf_latent: th.Tensor,
              action_masks: Any = None) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """From the ``mlp_extractor``'s inputs on: its actor and critic nets, the value head, the action head and the
        sampler; (actions, values, log_prob)."""
        mean_actions, latent_pi, values = self.latent_heads(pi_latent, vf_latent)
        actions, log_prob = self.sample(mean_actions, latent_pi, action_masks)
        return actions, values, log_prob

    def network(self, obs: th.Tensor | dict[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Everything before the random draws: (action net output, actor latent, values) of ``obs``."""
        return self.latent_heads(*self.features(obs))

    def latent_heads(self, pi_latent: th.Tensor, vf_latent: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """The ``mlp_extractor``'s actor and critic nets, the value head and the action head:
        (action net output, actor latent, values)."""
        latent_pi = self.actor(pi_latent)
        values = self.value_net(self.critic(vf_latent))
        return self.action_net(latent_pi), latent_pi, values

    def sample(self, mean_actions: th.Tensor, latent_pi: th.Tensor,
               action_masks: Any = None) -> tuple[th.Tensor, th.Tensor]:
        """The sampler on the action net's output: (actions in the action space's shape, log_prob)."""
        if action_masks is None:
            actions, log_prob = self.sampler(mean_actions, latent_pi)
        else:
            actions, log_prob = self.sampler(mean_actions, latent_pi, action_masks)  # type: ignore[call-arg]
        if actions.shape[1:] != self.action_shape:
            actions = actions.reshape((-1, *self.action_shape))
        return actions, log_prob
