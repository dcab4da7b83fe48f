#!/usr/bin/env bash
# Build the Dockerfile for real, offline and without a daemon, then run the image.
#
#   scripts/build_image.sh              # what `make image` and CI run
#
# 1. Tools: buildah and debootstrap from Debian's packages (installed with apt-get when
#    missing; CI runs as root).
# 2. Base: a Debian bookworm root file system made here with debootstrap (python3 and
#    python3-venv, nothing else), imported as localhost/keda-gpu-scaler-base:bookworm and
#    reused while its recipe is unchanged. It replaces the Dockerfile's default base (the
#    official python image, pinned by digest), which this machine cannot pull.
# 3. Wheels: this project's wheel and those of its pinned dependencies for the base's
#    CPython 3.11, in wheelhouse/ (pip fetches them from PyPI, or takes them from its cache).
# 4. Build: `buildah build` with the vfs storage driver (no overlay mounts needed), chroot
#    isolation (no OCI runtime needed), in a network namespace with no interface up, so no
#    network at all: the Dockerfile installs from wheelhouse/ without an index.
# 5. Run: the image's own entrypoint, environment and user (65532:65532) on its root file
#    system mounted read-only, in new mount, PID and network namespaces (unshare, chroot):
#    what an OCI runtime does. podman's runtimes (crun, runc) cannot start a container in
#    this sandbox: they fail to set RLIMIT_NPROC. Runs `--version`, `demo` and
#    `gpu-metrics --source replay`, and checks what each prints.
#
# Prints each step's seconds and the image's size, and writes them with the machine to
# build/image.json (docs/image.md quotes a run).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
BASE_PYTHON=3.11 # bookworm's python3
STORAGE=(--storage-driver vfs)
VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE=localhost/keda-gpu-scaler:$VERSION
BASE=localhost/keda-gpu-scaler-base:$SUITE
REPORT=build/image.json
mkdir -p build
declare -A SECONDS_OF

now() { date +%s.%N; }
step() { # step NAME COMMAND...: run it, keep its seconds
    local name=$1 start
    shift
    start=$(now)
    "$@"
    SECONDS_OF[$name]=$(echo "$(now) - $start" | bc)
    printf 'image: %-8s %6.1f s\n' "$name" "${SECONDS_OF[$name]}"
}

tools() {
    local -A package=([buildah]=buildah [debootstrap]=debootstrap [bc]=bc [jq]=jq [ip]=iproute2)
    local missing=()
    for tool in "${!package[@]}"; do
        command -v "$tool" > /dev/null || missing+=("${package[$tool]}")
    done
    if ((${#missing[@]})); then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
    fi
}

# The base is remade only when this recipe changes: its hash is in the image's label.
BASE_RECIPE="debootstrap --variant=minbase --include=python3,python3-venv $SUITE $MIRROR; trimmed v1"
BASE_HASH=$(printf '%s' "$BASE_RECIPE" | sha256sum | cut -c1-16)

base() {
    local have root container
    have=$(buildah "${STORAGE[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "keda-gpu-scaler.base"}}' "$BASE" 2> /dev/null || true)
    [[ $have == "$BASE_HASH" ]] && return 0
    root=$(mktemp -d)
    debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$root" "$MIRROR" > build/debootstrap.log
    # What an image does not need: package lists and caches, documentation, translations.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
        "$root"/usr/share/locale/* "$root"/var/log/*
    tar -C "$root" -cf "$root.tar" .
    container=$(buildah "${STORAGE[@]}" from scratch)
    buildah "${STORAGE[@]}" add --quiet "$container" "$root.tar" /
    buildah "${STORAGE[@]}" config --label "keda-gpu-scaler.base=$BASE_HASH" \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /usr/bin/python3 "$container"
    buildah "${STORAGE[@]}" commit --quiet --rm "$container" "$BASE" > /dev/null
    rm -rf "$root" "$root.tar"
}

wheels() {
    local arch
    arch=$(uname -m)
    find wheelhouse -name '*.whl' -delete
    "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir wheelhouse .
    "$PYTHON" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > build/requirements.txt
    "$PYTHON" -m pip download --quiet --dest wheelhouse --only-binary=:all: \
        --python-version "$BASE_PYTHON" --implementation cp \
        --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
        --platform "manylinux_2_28_$arch" --platform "manylinux_2_34_$arch" \
        -r build/requirements.txt
}

# In a network namespace of its own, with nothing in it: chroot isolation has no network
# setting of its own (it shares the caller's), so the caller has none.
build() {
    unshare --net buildah "${STORAGE[@]}" build --quiet --isolation chroot --pull=never \
        --layers=false --build-arg "BASE=$BASE" --tag "$IMAGE" . > /dev/null
}

# The image's configuration: its environment, entrypoint and user, as a runtime reads them.
image_config() {
    local config
    config=$(buildah "${STORAGE[@]}" inspect --type image "$IMAGE" | jq '.OCIv1.config')
    mapfile -t IMAGE_ENV < <(jq -r '.Env[]' <<< "$config")
    mapfile -t IMAGE_ENTRYPOINT < <(jq -r '.Entrypoint[]' <<< "$config")
    IMAGE_USER=$(jq -r '.User' <<< "$config")
}

# in_image COMMAND...: COMMAND in a container of the image, as the image's user, on its root
# file system mounted read-only, with a fresh /proc, a small /tmp (as the chart gives the
# pod) and a network of its own with loopback only. Every run shares one container's root
# file system (CONTAINER_ROOT): read-only, none can change what the next one sees.
in_image() {
    unshare --mount --net --pid --fork --mount-proc sh -ec '
        root=$1 user=$2
        shift 2
        ip link set lo up
        mount --bind "$root" "$root"
        mount -o remount,bind,ro "$root"
        mount -t proc proc "$root/proc"
        mount -t tmpfs -o size=16m,mode=1777 tmpfs "$root/tmp"
        exec chroot --userspec="$user" "$root" "$@"
    ' sh "$CONTAINER_ROOT" "$IMAGE_USER" /usr/bin/env -i "${IMAGE_ENV[@]}" "$@"
}

# image ARGS...: the image's entrypoint with ARGS, as `docker run IMAGE ARGS` would.
image() { in_image "${IMAGE_ENTRYPOINT[@]}" "$@"; }

# A check that fails ends the checks' subshell (errexit does not hold there).
fail() {
    echo "image: $1" >&2
    exit 1
}

checks() {
    local container
    image_config
    container=$(buildah "${STORAGE[@]}" from --quiet "$IMAGE")
    CONTAINER_ROOT=$(buildah "${STORAGE[@]}" mount "$container")
    local status=0
    (run_checks) || status=$?
    buildah "${STORAGE[@]}" umount "$container" > /dev/null
    buildah "${STORAGE[@]}" rm "$container" > /dev/null
    return "$status"
}

run_checks() {
    local out
    [[ $IMAGE_USER == "65532:65532" ]] || fail "the image's user is $IMAGE_USER"
    out=$(image --version)
    [[ $out == "keda-gpu-scaler $VERSION" ]] || fail "--version said: $out"
    out=$(image demo --duration 3 --every 1)
    grep -q "recorded phase" <<< "$out" || fail "demo said: $out"
    out=$(in_image gpu-metrics --source replay --format json)
    jq -e '.devices[0].uuid | startswith("GPU-")' <<< "$out" > /dev/null \
        || fail "gpu-metrics said: $out"
    out=$(in_image python3 -c 'import os; print(os.getuid(), os.getgid())')
    [[ $out == "65532 65532" ]] || fail "ran as $out"
    # The root file system is read-only: nothing can be written outside /tmp.
    if in_image python3 -c 'open("/opt/keda-gpu-scaler/x", "w")' 2> /dev/null; then
        fail "the root file system is writable"
    fi
}

# The release workflow, with actionlint (a Go program, built from its module when a Go
# toolchain is there; CI has one).
lint() {
    if ! command -v go > /dev/null; then
        echo "image: no Go toolchain here: .github/workflows/release.yml is not linted"
        return 0
    fi
    GOBIN="$PWD/build/bin" GOFLAGS=-mod=mod go install github.com/rhysd/actionlint/cmd/actionlint@v1.7.7
    build/bin/actionlint .github/workflows/release.yml
}

report() {
    local seconds='{}' name
    for name in "${!SECONDS_OF[@]}"; do
        seconds=$(jq --arg k "$name" --argjson v "${SECONDS_OF[$name]}" '.[$k] = ($v * 10 | round / 10)' <<< "$seconds")
    done
    jq -n --arg image "$IMAGE" --arg cores "$(nproc)" \
        --arg size "$(buildah "${STORAGE[@]}" images --format '{{.Size}}' "$IMAGE")" \
        --arg base_size "$(buildah "${STORAGE[@]}" images --format '{{.Size}}' "$BASE")" \
        --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)" \
        --argjson seconds "$seconds" \
        '{image: $image, size: $size, base: $base_size, cores: ($cores | tonumber), cpu: $cpu,
          seconds: $seconds, total_seconds: ([$seconds[]] | add * 10 | round / 10)}' \
        | tee "$REPORT"
}

step tools tools
step base base
step wheels wheels
step build build
step checks checks
step lint lint
report
