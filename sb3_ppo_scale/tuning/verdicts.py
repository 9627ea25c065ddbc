"""Which measured stars a study supports, and the verdict against the documented table.

Per study, evaluator and real (non-dummy) parameter (:func:`rate`):

1. **Noise floor**: the parameter's bootstrap 5-95% importance interval must lie above every dummy parameter's
   interval (its low end above the highest dummy high end). Otherwise it is *not distinguishable from noise* and
   gets no stars from that evaluator. A study without a dummy parameter, or a report without bootstrap, has no
   noise floor: nothing is rated.
2. **Star stability**: its star rating must be the same in at least :data:`STAR_STABILITY` of the bootstrap
   resamples; otherwise no stars from that evaluator either.

A parameter keeps stars where at least one evaluator rates it. The verdict (:func:`verdict`) compares the median of
its rated stars (over studies and evaluators) with the documented stars: exactly one of :data:`VERDICTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sb3_ppo_scale.tuning.importance import Stability

#: Share of bootstrap resamples in which a rated parameter must keep its star rating.
STAR_STABILITY = 0.8
#: Split-half rank correlation a study should reach; below it the report says why.
MIN_SPLIT_HALF = 0.6
NOT_DISTINGUISHABLE = "not distinguishable from noise"
VERDICTS = ("agrees", "overrates", "underrates", NOT_DISTINGUISHABLE)
VERDICT_RULE = ("'agrees': the median of our rated stars (studies x evaluators) equals the documented stars; "
                "'overrates': the documented table gives more stars than that median; 'underrates': fewer; "
                f"'{NOT_DISTINGUISHABLE}': no evaluator in any study rates the parameter (importance interval "
                f"overlapping the dummy's, or stars kept in < {STAR_STABILITY:.0%} of the bootstrap resamples)")


@dataclass(frozen=True)
class Rating:
    """One parameter under one evaluator in one study.

    ``stars``: the stars it keeps (0: none); ``raw_stars``: by the stars rule on all trials; ``above_noise``:
    whether its interval clears the dummy's (None: no noise floor); ``star_share``: share of resamples with the same
    ``raw_stars`` (None: no bootstrap); ``status``: the noise-floor status in words.
    """

    stars: int
    raw_stars: int
    above_noise: bool | None
    star_share: float | None
    status: str


def noise_ceiling(stability: Stability, dummies: list[str]) -> float | None:
    """The top of the dummy parameters' bootstrap intervals (None: no dummy or no bootstrap)."""
    highs = [stability.high[d] for d in dummies if d in stability.high]
    return max(highs) if highs and stability.n_resamples else None


def rate(param: str, raw_stars: int, stability: Stability, dummies: list[str]) -> Rating:
    """Apply the noise floor and the star-stability rule to one parameter (see the module docstring)."""
    ceiling = noise_ceiling(stability, dummies)
    if ceiling is None:
        why = "no dummy parameter" if not dummies else "no bootstrap"
        return Rating(0, raw_stars, None, None, f"not checked ({why})")
    low, high = stability.low[param], stability.high[param]
    share = stability.same_stars.get(param)
    if low <= ceiling:
        return Rating(0, raw_stars, False, share, f"{NOT_DISTINGUISHABLE} ({low:.2f}-{high:.2f} overlaps dummy <= {ceiling:.2f})")
    if share is None or share < STAR_STABILITY:
        kept = "-" if share is None else f"{share:.0%}"
        return Rating(0, raw_stars, True, share,
                      f"above noise, stars unstable (kept in {kept} < {STAR_STABILITY:.0%}): {NOT_DISTINGUISHABLE}")
    return Rating(raw_stars, raw_stars, True, share, f"above noise ({low:.2f} > dummy {ceiling:.2f}), stars kept in {share:.0%}")


def verdict(documented: int, rated: list[int]) -> str:
    """One of :data:`VERDICTS` from the documented stars and our rated stars (0 = none, left out)."""
    kept = [s for s in rated if s > 0]
    if not kept:
        return NOT_DISTINGUISHABLE
    middle = float(np.median(kept))
    if middle == documented:
        return "agrees"
    return "overrates" if documented > middle else "underrates"


def split_half_note(rho: float | None, n_trials: int, ratings: dict[str, Rating]) -> str:
    """Why a split-half rank correlation is below :data:`MIN_SPLIT_HALF` (empty when it is not)."""
    if rho is not None and rho >= MIN_SPLIT_HALF:
        return ""
    if rho is None:
        return f"not computed: {n_trials} trials give halves of {n_trials // 2} (< 4) or a half without spread"
    noise = [p for p, r in ratings.items() if r.above_noise is False]
    reasons = []
    if len(noise) >= 2:
        reasons.append(f"{len(noise)} of {len(ratings)} parameters are inside the noise floor, so their order in each "
                       "half is noise")
    elif any(r.above_noise is None for r in ratings.values()):
        reasons.append("no noise floor to tell noise from effect")
    if n_trials // 2 < 32:
        reasons.append(f"halves of {n_trials // 2} trials")
    if not reasons:
        reasons.append("the ranking of the parameters above the noise floor changes between the halves")
    return f"below {MIN_SPLIT_HALF}: " + "; ".join(reasons)
