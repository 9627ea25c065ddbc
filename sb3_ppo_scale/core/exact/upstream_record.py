"""``python -m sb3_ppo_scale.core.exact.upstream_record``: add the installed upstream fingerprints to the record.

For maintainers, after the parity tests passed on new SB3 / sb3-contrib / torch versions (see
:mod:`sb3_ppo_scale.core.exact.upstream`); ``--check`` lists the reproduced functions whose installed code is not recorded.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pprint
from pathlib import Path

from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3 import PPO
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ppo_scale.core.exact import upstream_verified
from sb3_ppo_scale.core.policy.inference import REPLACED_METHODS
from sb3_ppo_scale.core.exact.upstream import (
    COLLECTION_PARTS,
    PACKAGES,
    POLICY_LAYERS,
    TORCH_DISTRIBUTIONS,
    UPDATE_PARTS,
    VEC_ENV_STEP,
    Function,
    changed_upstream,
    distribution_functions,
    fingerprint,
    name_of,
    resolve,
    upstream_method,
)


def everything_reproduced() -> list[Function]:
    """Every upstream function any exact path names, for the installed packages (the record's entries)."""
    replaced = (*REPLACED_METHODS, "evaluate_actions")
    policy_methods = [upstream_method(policy, name) for policy in (ActorCriticPolicy, MaskableActorCriticPolicy)
                      for name in replaced]
    policy_methods += [upstream_method(RecurrentActorCriticPolicy, name) for name in (*replaced, "_process_sequence")]
    functions = [*policy_methods, *resolve(POLICY_LAYERS), *resolve(VEC_ENV_STEP), *resolve(COLLECTION_PARTS),
                 *(function for parts in UPDATE_PARTS.values() for function in resolve(parts))]
    functions += [function for distribution in TORCH_DISTRIBUTIONS for function in distribution_functions(distribution)]
    for algorithm in (PPO, MaskablePPO, RecurrentPPO):
        functions += [upstream_method(algorithm, "collect_rollouts"), upstream_method(algorithm, "train")]
    return list(dict.fromkeys(functions))


def record(path: Path = Path(upstream_verified.__file__)) -> int:
    """Add the installed fingerprints (and versions) to :mod:`~sb3_ppo_scale.core.exact.upstream_verified`, keeping the
    recorded ones; the number of fingerprints added."""
    fingerprints = {name: list(values) for name, values in upstream_verified.FINGERPRINTS.items()}
    added = 0
    for function in everything_reproduced():
        value = fingerprint(function)
        if value is not None and value not in fingerprints.setdefault(name_of(function), []):
            fingerprints[name_of(function)].append(value)
            added += 1
    versions = {package: list(values) for package, values in upstream_verified.VERIFIED_WITH.items()}
    for package in PACKAGES.values():
        installed = importlib.metadata.version(package).split("+")[0]  # a build tag (+cpu, +cu128) is not the code
        if installed not in versions.setdefault(package, []):
            versions[package].append(installed)
    header = (upstream_verified.__doc__ or "").strip()
    path.write_text(f'"""{header}\n"""\n\nVERIFIED_WITH = {pprint.pformat(versions, width=116)}\n\n'
                    f"FINGERPRINTS = {pprint.pformat({k: tuple(v) for k, v in sorted(fingerprints.items())}, width=116)}"
                    "\n")
    return added


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sb3_ppo_scale.core.exact.upstream_record", description=(
        "Add the installed SB3, sb3-contrib and torch functions that sb3-ppo-scale's exact paths reproduce to the "
        "record (after the parity tests passed on them); --check only lists those not recorded."))
    parser.add_argument("--check", action="store_true",
                        help="list the reproduced functions not recorded; write nothing")
    args = parser.parse_args(argv)
    if not args.check:
        print(f"{record()} fingerprints added to {upstream_verified.__file__}")
        return
    changed = [name_of(function) for function in everything_reproduced()
               if changed_upstream((function,)) is not None]
    print("\n".join(changed) if changed else "every reproduced function is the recorded code")


if __name__ == "__main__":
    main()
