#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one call (sized for a ~15-minute device lease):
#   1. every test marked `cuda` (pytest -m cuda tests; 47 cases, docs/testing.md): tests/test_cuda.py (ScalablePPO ==
#      PPO and the contrib classes == theirs on CUDA; cuda_graphs=True == eager; the lean loop on CUDA writes the
#      rollout SB3's loop writes, its policy step eager and replayed from a graph) and tests/test_staging.py's CUDA
#      cases (the staged rollout's minibatches == SB3's RolloutBuffer.get on the GPU);
#   2. benchmarks/train_phase.py --device cuda: update-phase throughput and peak memory against SB3 PPO;
#   3. with CPU_BENCH=1, benchmarks/train_phase.py --device cpu on the GPU box's many cores (the CPU target of
#      issue 2 was set on an 8-thread CPU), written as train_phase_cpu.md in $OUT;
#   4. with PROFILE=1, cProfile breakdowns of train() (benchmarks/studies/profile_train.py);
#   5. with COMPILE=1, both train_phase runs also time ScalablePPO(compile_loss=True) (inductor: Triton on CUDA, a
#      C++ compiler on the CPU; off by default so a box without one still gives the other figures);
#   6. with CONTRIB=1, benchmarks/contrib_train.py --device cuda: the contrib classes' train() against sb3-contrib's
#      on the GPU (the recurrent sequence_length variants also with cuda_graphs=True), cases $CONTRIB_CASES (default
#      masking,cartpole_novel,pendulum_novel; the NoVel envs need rl_zoo3: pass rl_zoo3==2.9.2 to
#      ../shared/device/wheels.sh; atari_cnnlstm needs ale-py), written as contrib/train_cuda.md.
#   7. with COLLECT=1, benchmarks/end_to_end.py collect --device cuda: SB3's loop against the lean loop with the
#      policy on the GPU (rollouts checked equal), and beside them ScalablePPO's cuda_graphs=True (the policy step
#      replayed from a CUDA graph, rollouts checked equal) and collect_device="cpu", Hopper-v5 at
#      $COLLECT_ENVS envs (default "1 8 64"; needs gymnasium[mujoco]), written as end_to_end/collect_cuda.md.
#   8. with SCALE=1, benchmarks/scale.py on the box's cores and GPU: the per-stage cost model (model) and end-to-end
#      learn() steps/s of SB3 PPO on DummyVecEnv and on EnvPool against ScalablePPO's scale plan, at $SCALE_CORES
#      cores (default "1 <all>"), CPU rows and GPU rows (--device cuda), Hopper-v5, written as scale/scale.md and
#      scale/cost_model.md. Needs EnvPool: the slim build of ../shared/device/envpool_slim.sh (its tarballs in .whl/,
#      unpacked as that script says, ENVPOOL_ASSETS_PATH set).
# Usage on a GPU machine with this project installed (or its wheels on PYTHONPATH):
#   OUT=benchmarks/results bash benchmarks/gpu_checks.sh
# Logs and train_phase_cuda.md land in $OUT (default benchmarks/results).
set -uo pipefail
OUT=${OUT:-benchmarks/results}
COMPILE_FLAG=$([ -n "${COMPILE:-}" ] && echo --compile || echo --no-compile)
PY=${PYTHON:-python3}
# MUJOCO_GL is left unset: nothing here renders, and on an image without an EGL loader `MUJOCO_GL=egl` makes
# `import mujoco` fail (seen on the H200 box), which stopped every MuJoCo benchmark.
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-240}" "$PY" -m pytest -q -rs -p no:cacheprovider -n "${TEST_WORKERS:-6}" -m cuda tests 2>&1 \
  | tee "$OUT/test_cuda.log" | tail -25
timeout "${BENCH_TIMEOUT:-300}" "$PY" benchmarks/train_phase.py --device cuda "$COMPILE_FLAG" --repeats "${REPEATS:-3}" --out "$OUT" 2>&1 \
  | grep -v USDT | tee "$OUT/train_phase_cuda.log"
if [ ! -s "$OUT/train_phase_cuda.md" ]; then  # the graph variant failed: keep the eager figures at least
  echo "train_phase with cuda_graphs failed; rerunning without it"
  timeout "${BENCH_TIMEOUT:-300}" "$PY" benchmarks/train_phase.py --device cuda --no-graphs --repeats "${REPEATS:-3}" \
    --out "$OUT" 2>&1 | grep -v USDT | tee "$OUT/train_phase_cuda_nographs.log"
fi
if [ -n "${PROFILE:-}" ]; then  # host-time breakdown of train() (cProfile), for finding what is left to remove
  timeout 120 "$PY" benchmarks/studies/profile_train.py --device cuda --shape halfcheetah --batch 65536 > "$OUT/profile_halfcheetah_65536.txt" 2>&1
  timeout 120 "$PY" benchmarks/studies/profile_train.py --device cuda --shape atari --batch 4096 > "$OUT/profile_atari_4096.txt" 2>&1
  for f in "$OUT"/profile_*.txt; do tail -n 3 "$f"; done
fi
if [ -n "${CPU_BENCH:-}" ]; then
  timeout "${CPU_BENCH_TIMEOUT:-240}" "$PY" benchmarks/train_phase.py --device cpu "$COMPILE_FLAG" --repeats "${REPEATS:-3}" --out "$OUT" 2>&1 \
    | grep -v USDT | tee "$OUT/train_phase_cpu.log"
fi
if [ -n "${CONTRIB:-}" ]; then
  OMP_NUM_THREADS=1 timeout "${CONTRIB_TIMEOUT:-240}" "$PY" benchmarks/contrib_train.py --device cuda --repeats "${REPEATS:-3}" \
    --cases "${CONTRIB_CASES:-masking,cartpole_novel,pendulum_novel}" --out "$OUT/contrib" 2>&1 | grep -v USDT \
    | tee "$OUT/contrib_train_cuda.log" | tail -20
fi
if [ -n "${COLLECT:-}" ]; then
  # shellcheck disable=SC2086  # COLLECT_ENVS is a list of numbers
  OMP_NUM_THREADS=1 timeout "${COLLECT_TIMEOUT:-240}" "$PY" benchmarks/end_to_end.py collect --device cuda --envs Hopper-v5 \
    --n-envs ${COLLECT_ENVS:-1 8 64} --repeats "${REPEATS:-3}" 2>&1 | grep -v USDT | tee "$OUT/collect_cuda.log" | tail -8
  mkdir -p "$OUT/end_to_end" && cp benchmarks/results/end_to_end/collect_cuda.md "$OUT/end_to_end/"
fi
if [ -n "${SCALE:-}" ]; then
  all=$(nproc)
  if ! "$PY" -c "import envpool" 2>/dev/null && [ -f .whl/envpool_slim.tar.xz ]; then
    # EnvPool's slim build (../shared/device/envpool_slim.sh): its MuJoCo, Atari and classic-control parts and assets
    mkdir -p /tmp/envpool_site && tar -xJf .whl/envpool_slim.tar.xz -C /tmp/envpool_site \
      && tar -xJf .whl/envpool_assets_slim.tar.xz -C /tmp \
      && export PYTHONPATH="/tmp/envpool_site:${PYTHONPATH:-}" ENVPOOL_ASSETS_PATH=/tmp/envpool_assets_slim
  fi
  mkdir -p "$OUT/scale"
  timeout "${SCALE_MODEL_TIMEOUT:-150}" "$PY" benchmarks/scale.py model --tasks Hopper-v5 --out "$OUT/scale" 2>&1 \
    | grep -v USDT | tee "$OUT/scale_model.log" | tail -6
  for device in cpu cuda; do
    # shellcheck disable=SC2086  # SCALE_CORES is a list of numbers
    timeout "${SCALE_TIMEOUT:-200}" "$PY" benchmarks/scale.py run --device "$device" --tasks Hopper-v5 \
      --cores ${SCALE_CORES:-1 $all} --variants sb3_dummy sb3_fast scalable --repeats "${SCALE_REPEATS:-2}" \
      --out "$OUT/scale" 2>&1 | grep -v USDT | tee "$OUT/scale_$device.log" | tail -8
  done
fi
