# Sourced by demo.sh and test.sh: put torch into .venv unless it holds one already.
#
# A plain `pip install torch` on Linux pulls the CUDA build (several GB). Where no NVIDIA GPU
# answers, take PyTorch's CPU-only build from its own index, and the default index where that
# one cannot be reached. A torch already in .venv (one that CI put there) is used as it is.
install_torch() {
  local pip=".venv/bin/pip"
  if .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), found in .venv"
    return
  fi
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "installing torch with CUDA from the default index (a few GB)"
    "$pip" install -q torch
    return
  fi
  local cpu_index="https://download.pytorch.org/whl/cpu"
  echo "no NVIDIA GPU: installing torch's CPU-only build from $cpu_index (about 200 MB)"
  if ! "$pip" install -q --retries 1 --timeout 20 --index-url "$cpu_index" torch 2>/dev/null; then
    echo "$cpu_index cannot be reached: installing torch from the default index instead" \
      "(on Linux its CUDA build, a few GB)"
    "$pip" install -q torch
  fi
}
