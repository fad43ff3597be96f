# Shared set-up for scripts/*: a Rust toolchain and a build cache outside the clone.
# Sourced, not run.

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo is not installed; install Rust with rustup (https://rustup.rs) and retry" >&2
  exit 1
fi

# Builds survive fresh clones: CI and every checkout on this machine share one cache.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgraph/target}"
mkdir -p "$CARGO_TARGET_DIR"

ensure_components() {
  for c in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$c"; then
      rustup component add "$c"
    fi
  done
}
