# Sourced by the multi-GPU scripts (run_multi_gpu.sh, run_tp_flash.sh): finds libnccl.so.2 on the
# GPU machine (deepserve loads NCCL at run time) and exports DEEPSERVE_NCCL_LIBRARY; sets $nccl
# (empty when none was found) and the NCCL environment the shared GPU hosts need.
# NCCL: the caller's choice, the Python wheel (nvidia-nccl-cu12), the loader's cache, any file.
find_nccl() {
  if [ -n "${DEEPSERVE_NCCL_LIBRARY:-}" ] && [ -e "$DEEPSERVE_NCCL_LIBRARY" ]; then
    echo "$DEEPSERVE_NCCL_LIBRARY"; return
  fi
  local p
  # The wheel's layout differs between CUDA 12 (nvidia/nccl/lib) and 13 packages: search the
  # whole nvidia namespace package.
  p=$(python3 - 2>/dev/null <<'EOF'
import os
import nvidia
for root in list(nvidia.__path__):
    for d, _, files in os.walk(root):
        if "libnccl.so.2" in files:
            print(os.path.join(d, "libnccl.so.2"))
            raise SystemExit
EOF
)
  if [ -n "$p" ]; then echo "$p"; return; fi
  p=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  if [ -n "$p" ]; then echo "$p"; return; fi
  p=$(find /usr /opt /usr/local /root /home -name 'libnccl.so.2*' -type f 2>/dev/null | head -1)
  if [ -z "$p" ]; then
    p=$(find / -xdev -name 'libnccl.so.2*' -type f -not -path '/proc/*' 2>/dev/null | head -1)
  fi
  echo "$p"
}
nccl=$(find_nccl)
if [ -n "$nccl" ]; then
  export DEEPSERVE_NCCL_LIBRARY="$nccl"
  echo "NCCL: $nccl"
else
  echo "NCCL: not found on this machine; the NCCL tests will skip" >&2
fi
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# NVLink multicast (NVLS) stays off on the shared GPU hosts (/work/.library/device/KINDS.md): it
# can take the host's GPUs out of service. Forced here even if the caller's environment lacks it.
export NCCL_NVLS_ENABLE=0
