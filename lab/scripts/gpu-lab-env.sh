# Sourced by the lab scripts (gpu-lab-run.sh, gpu-lab-regimes.sh) on the GPU lab machine, with the
# run's NAME as $1: the environment, the machine prepared (gpu-lab-prepare.sh: idempotent, seconds)
# and $run, the run's folder under /root/runs.
export PYTHONPATH="/root/site:/root/extra:$PWD:$PWD/lab" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# vLLM's compile cache survives between the runs of one machine lease (the machine keeps /root while
# warm): the second start of a config skips torch.compile. gpu-lab-prepare.sh makes the folders, the
# plugin declaration and the GPU-bound rig's model.
export VLLM_CACHE_ROOT=/root/vllm-cache TORCHINDUCTOR_CACHE_DIR=/root/vllm-cache/inductor
bash "$(dirname "${BASH_SOURCE[0]}")/gpu-lab-prepare.sh" --quiet || exit 1
run="/root/runs/$1"
mkdir -p "$run"
