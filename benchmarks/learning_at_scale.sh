#!/usr/bin/env bash
# The learning-at-scale benchmark: each task's measured large-batch recipe (ScalablePPO, `@recipe` in
# sb3_ppo_scale/experiments/configs/scalable_ppo.yml) against SB3's PPO at the strongest config we have for the task
# (the task's plain entry: rl_zoo3's where it has one, SB3's defaults + VecNormalize otherwise), 3 seeds each, and SB3's
# PPO at the recipe's config with a constant rate (`@recipe_const`, one seed: what the config alone buys).
# Evaluations every 250k env steps, 10 deterministic episodes; Hopper-v5 and HalfCheetah-v5 to 5M, Ant-v5 and
# Humanoid-v5 to 10M.
#
#   bash benchmarks/learning_at_scale.sh [TASK ...]     # default: every task that has an @recipe entry
#
# Every run is single-threaded and checkpoints every 100k steps; two run at a time (WORKERS). Interrupted (SIGTERM,
# exit code 75), the same command continues where each run stopped, and finished runs are kept. Run nothing else on
# the box meanwhile: the report's wall-clock columns are this box's. At the end the report (tables, performance
# profile, curves) is rebuilt from $OUT/runs.
#
# Cost on the 2-core box (one core per run, two runs at once): the recipes ~20 min per 5M Hopper steps, ~16 min per
# 5M HalfCheetah steps, ~70 min per 10M Ant steps and ~2 h per 10M Humanoid steps (training and evaluations); SB3's
# PPO at one env ~1.5k steps/s, so ~1 h per 5M and ~2 h per 10M steps. Runs already in $OUT/runs are kept (see
# $OUT/README.md for those taken over from the recipe search).
set -euo pipefail

OUT=${OUT:-benchmarks/results/learning_at_scale}
WORKERS=${WORKERS:-2}
BENCH=(sb3-ppo-scale bench --no-pairs --eval-every 250000 --eval-episodes 10 --final-episodes 10
       --baseline sb3_ppo@plain --workers "$WORKERS" --out "$OUT")
ALL_TASKS=(Hopper-v5 HalfCheetah-v5 Ant-v5 Humanoid-v5)

budget() {  # env steps per run for task $1
    case "$1" in Ant-v5|Humanoid-v5) echo 10000000 ;; *) echo 5000000 ;; esac
}

has_recipe() {  # task $1 has an @recipe entry in the package config
    python - "$1" <<'EOF'
import sys
from sb3_ppo_scale.experiments import zoo
raise SystemExit(0 if f"{sys.argv[1]}@recipe" in zoo.read_entries(zoo.DEFAULT_CONFIG) else 1)
EOF
}

tasks=("$@")
if [ ${#tasks[@]} -eq 0 ]; then
    for task in "${ALL_TASKS[@]}"; do
        if has_recipe "$task"; then tasks+=("$task"); fi
    done
fi
for task in "${tasks[@]}"; do
    has_recipe "$task" || { echo "learning_at_scale.sh: $task has no @recipe entry yet" >&2; exit 2; }
    steps=$(budget "$task")
    OMP_NUM_THREADS=1 "${BENCH[@]}" --tasks "$task" --algos scalable_ppo@recipe sb3_ppo@plain --seeds 0 1 2 \
        --budget "$steps"
    OMP_NUM_THREADS=1 "${BENCH[@]}" --tasks "$task" --algos sb3_ppo@recipe_const --seeds 0 --budget "$steps"
done
"${BENCH[@]}" --tasks "${tasks[@]}" --algos scalable_ppo@recipe sb3_ppo@plain sb3_ppo@recipe_const --seeds 0 1 2 \
    --budget 5000000 --report-only
