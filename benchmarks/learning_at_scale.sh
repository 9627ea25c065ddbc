#!/usr/bin/env bash
# The learning-at-scale benchmark: each task's measured large-batch recipe (ScalablePPO, `@recipe` in
# sb3_ppo_scale/experiments/configs/scalable_ppo.yml) against SB3's PPO at the strongest config we have for the task
# (the task's plain entry: rl_zoo3's where it has one, SB3's defaults + VecNormalize otherwise), 3 seeds each, and SB3's
# PPO at the recipe's config with a constant rate (`@recipe_const`: what the config alone buys; one seed, and 3 on
# Ant-v5 and Humanoid-v5, where the plain entry does not learn to walk and this config is SB3's strongest).
# Evaluations every 250k env steps, 10 deterministic episodes; Hopper-v5 and HalfCheetah-v5 to 5M, Ant-v5 and
# Humanoid-v5 to 10M.
#
#   bash benchmarks/learning_at_scale.sh [TASK ...]     # default: every task that has an @recipe entry
#
# Every run is single-threaded and checkpoints every 100k steps. The runs form one queue, longest budget first and per
# task the recipe, then SB3's PPO at its config, then the plain entry (the slowest runs, so an interrupted queue has
# the comparison with the recipe's config first). WORKERS lanes (default 2) each take the next run not yet taken, one
# `bench` process per run, so no core idles while runs are left. Interrupted (SIGTERM to this script or to the bench
# processes, exit code 75), the same command continues where each run stopped, and finished runs are kept. Run
# nothing else on the box meanwhile: the report's wall-clock columns are this box's. When every run is in, the
# report (tables, performance profile, curves) is rebuilt from $OUT/runs over every task of the benchmark found there.
#
# Cost on the 2-core box (one core per run, two runs at once; boxes of this kind differ, these are the measured
# ranges): the recipes ~20 min per 5M Hopper steps, ~16 min per 5M HalfCheetah steps, ~70 min per 10M Ant steps and
# ~2 h per 10M Humanoid steps (training and evaluations); SB3's PPO at the recipe's config ~2250-2490 steps/s on
# Ant-v5 (~70 min per 10M); SB3's PPO at its plain entries ~770 steps/s on HalfCheetah-v5 (rl_zoo3's entry: 1 env,
# 20 epochs of minibatch 64), so ~1.8 h per 5M, 480-710 steps/s on Ant-v5 (~4.5 h per 10M) and ~590 steps/s on
# Humanoid-v5 (~4.7 h per 10M). Runs already in $OUT/runs are kept (see $OUT/README.md for those taken over from the
# recipe search).
set -euo pipefail

OUT=${OUT:-benchmarks/results/learning_at_scale}
WORKERS=${WORKERS:-2}
BENCH=(sb3-ppo-scale bench --no-pairs --eval-every 250000 --eval-episodes 10 --final-episodes 10
       --baseline sb3_ppo@plain --out "$OUT")
ALL_TASKS=(Hopper-v5 HalfCheetah-v5 Ant-v5 Humanoid-v5)

budget() {  # env steps per run for task $1
    case "$1" in Ant-v5|Humanoid-v5) echo 10000000 ;; *) echo 5000000 ;; esac
}

recipe_const_seeds() {  # seeds of SB3's PPO at @recipe_const for task $1 (3 where the plain entry does not walk)
    case "$1" in Ant-v5|Humanoid-v5) echo 0 1 2 ;; *) echo 0 ;; esac
}

has_recipe() {  # task $1 has an @recipe entry in the package config
    python - "$1" <<'PY'
import sys
from sb3_ppo_scale.experiments import zoo
raise SystemExit(0 if f"{sys.argv[1]}@recipe" in zoo.read_entries(zoo.DEFAULT_CONFIG) else 1)
PY
}

wait_for() {  # wait for process $1 until it has exited, through signals this shell traps; returns its exit code
    local rc
    while true; do
        wait "$1" && rc=0 || rc=$?
        kill -0 "$1" 2>/dev/null || return "$rc"
    done
}

run_lane() {  # run the queued runs no other lane has taken, one at a time; a run's non-zero exit code ends the lane
    local job task algo seed steps child=""
    trap '[ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM
    for job in "${queue[@]}"; do
        read -r task algo seed steps <<<"$job"
        mkdir "$taken/${task}__${algo}__${seed}" 2>/dev/null || continue  # another lane has it
        OMP_NUM_THREADS=1 "${BENCH[@]}" --workers 1 --tasks "$task" --algos "$algo" --seeds "$seed" \
            --budget "$steps" &
        child=$!
        wait_for "$child" || return $?
        child=""
    done
}

tasks=("$@")
if [ ${#tasks[@]} -eq 0 ]; then
    for task in "${ALL_TASKS[@]}"; do
        if has_recipe "$task"; then tasks+=("$task"); fi
    done
fi
queue=()  # "task algo seed budget", longest budget first; per task the recipe, its config alone, the plain entry
for steps in $(for task in "${tasks[@]}"; do budget "$task"; done | sort -rnu); do
    for task in "${tasks[@]}"; do
        [ "$(budget "$task")" = "$steps" ] || continue
        has_recipe "$task" || { echo "learning_at_scale.sh: $task has no @recipe entry yet" >&2; exit 2; }
        for seed in 0 1 2; do queue+=("$task scalable_ppo@recipe $seed $steps"); done
        for seed in $(recipe_const_seeds "$task"); do queue+=("$task sb3_ppo@recipe_const $seed $steps"); done
        for seed in 0 1 2; do queue+=("$task sb3_ppo@plain $seed $steps"); done
    done
done

taken=$(mktemp -d)
trap 'rm -rf "$taken"' EXIT
lanes=()
for ((lane = 0; lane < WORKERS; lane++)); do
    run_lane &
    lanes+=("$!")
done
trap 'kill -TERM "${lanes[@]}" 2>/dev/null' TERM INT
status=0
for pid in "${lanes[@]}"; do
    wait_for "$pid" || status=$?
done
if [ "$status" -ne 0 ]; then
    echo "learning_at_scale.sh: a run stopped (exit code $status); the same command continues" >&2
    exit "$status"
fi
"${BENCH[@]}" --tasks "${ALL_TASKS[@]}" --algos scalable_ppo@recipe sb3_ppo@plain sb3_ppo@recipe_const \
    --seeds 0 1 2 --budget 5000000 --report-only
