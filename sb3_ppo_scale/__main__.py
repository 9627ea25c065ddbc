"""``python -m sb3_ppo_scale``: the ``sb3-ppo-scale`` command (also what ``torchrun -m sb3_ppo_scale`` runs)."""

from sb3_ppo_scale.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
