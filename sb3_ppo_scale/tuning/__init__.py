"""Optuna studies of PPO's hyperparameter sensitivity (and a TPE search mode), run with ScalablePPO.

``load_spec`` reads a YAML study spec, ``tune`` runs it over worker processes on a journal file or an RDB, and
``build_report`` turns finished studies into a markdown table beside the documented sensitivity table plus PNGs.
"""

from sb3_ppo_scale.tuning.spec import StudySpec, load_spec, spec_from_dict

__all__ = ["StudySpec", "load_spec", "spec_from_dict"]
