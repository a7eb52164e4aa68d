#!/usr/bin/env bash
# The CPU image built on this machine from the project's Dockerfile, with no registry:
#
#   bash tools/local_image.sh [all]      # base (if missing) -> image -> OCI bundle
#   bash tools/local_image.sh base       # a Debian base from Debian's packages (debootstrap),
#                                        # imported into podman as localhost/debian-base:bookworm
#   bash tools/local_image.sh image      # podman build --build-arg STACK=cpu: localhost/megatron-seed:cpu
#   bash tools/local_image.sh mirror     # the Debian mirror the base would come from
#                                        # (SEED_DEBIAN_MIRROR overrides it)
#   bash tools/local_image.sh bundle     # the image as an OCI bundle (rootfs/ + config.json)
#                                        # for Slurm's `srun --container` (seed launch --container-bundle);
#                                        # SEED_BUNDLE_MOUNTS=DIR[:DIR...]: host folders jobs see
#                                        # besides /tmp and /dev/shm (launch.oci)
#
# Each step reuses what it already built: the base image if podman has it, the build's
# cached layers, the bundle if it holds the current image. Root with podman, buildah, runc
# and debootstrap (apt-get install podman buildah runc debootstrap). SEED_IMAGE_STORE (default
# /var/tmp/megatron-seed-image) holds the base rootfs, podman's settings and the bundle.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

# The Debian mirror apt uses here: SEED_DEBIAN_MIRROR if set, else the first `URIs:` of the
# deb822 sources or `deb` line of sources.list under SEED_APT_DIR (default /etc/apt) that
# points at a Debian archive; comment lines (a snapshot address kept as a note) are not read
debian_mirror() {
  if [[ -n "${SEED_DEBIAN_MIRROR:-}" ]]; then echo "$SEED_DEBIAN_MIRROR"; return; fi
  local apt="${SEED_APT_DIR:-/etc/apt}" found=""
  found="$(cat "$apt"/sources.list.d/*.sources 2>/dev/null \
    | sed -n -E 's|^[[:space:]]*URIs:[[:space:]]*(.*)$|\1|p' | tr ' ' '\n' \
    | grep -m1 -E '^https?://[^ ]+/debian/?$' || true)"
  if [[ -z "$found" ]]; then
    found="$(sed -n -E 's|^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?://[^ ]+/debian/?)[[:space:]].*$|\2|p' \
      "$apt/sources.list" 2>/dev/null | head -1 || true)"
  fi
  echo "${found:-http://deb.debian.org/debian}"
}
if [[ "${1:-}" == mirror ]]; then debian_mirror; exit 0; fi
store="${SEED_IMAGE_STORE:-/var/tmp/megatron-seed-image}"
base_image="localhost/debian-base:bookworm"
image="localhost/megatron-seed:cpu"
bundle="$store/bundle"
what="${1:-all}"
mkdir -p "$store"

for tool in podman runc debootstrap; do
  command -v "$tool" > /dev/null || {
    echo "local_image.sh: $tool is missing (apt-get install podman buildah runc debootstrap)" >&2
    exit 2
  }
done

# podman with runc (crun cannot run on hosts with hybrid cgroups) and ulimits the host's hard
# limits allow (podman's defaults exceed them on some hosts)
cat > "$store/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$store/containers.conf"

say() { echo "[local_image] $* ($SECONDS s)"; }

make_base() {
  if podman image exists "$base_image"; then say "base: $base_image exists"; return; fi
  local rootfs="$store/base-rootfs"
  if [[ ! -f "$rootfs/.complete" ]]; then
    rm -rf "$rootfs"
    local mirror
    mirror="$(debian_mirror)"
    say "base: debootstrap bookworm from $mirror (about 2 minutes)"
    if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$store/debootstrap.log" 2>&1; then
      echo "local_image.sh: debootstrap from $mirror failed (last lines of $store/debootstrap.log):" >&2
      tail -5 "$store/debootstrap.log" >&2
      exit 1
    fi
    touch "$rootfs/.complete"  # only a base that debootstrap finished
  fi
  say "base: importing into podman as $base_image"
  tar --exclude=./.complete -C "$rootfs" -c . | podman import - "$base_image" > /dev/null
}

make_image() {
  # extra CA certificates of this machine (a TLS-inspecting proxy) are mounted into the
  # build; the image's system bundle takes them (tools/image.sh system)
  local volumes=()
  if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
    volumes=(--volume /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
  fi
  # this machine's pip settings (all of them, from its config files and PIP_* variables, as
  # one pip.conf) and the local package folders and files they name (find-links, file://
  # indexes, constraints): the image installs from the sources a bare install uses
  python3 -m pip config list 2>/dev/null | python3 "$here/tools/pip_settings.py" > "$store/pip.conf"
  volumes+=(--volume "$store/pip.conf:/etc/pip.conf:ro")
  local path
  while read -r path; do
    [[ -e "$path" && "$path" != /etc/ssl/* ]] && volumes+=(--volume "$path:$path:ro")
  done < <(grep -o -E "(file://)?/[^ ]+" "$store/pip.conf" | sed -e 's#^file://##' \
    -e 's#/simple/*$##' | sort -u)  # an index's pages link into its folder beside simple/
  say "image: podman build $image (the first build installs the CPU stack: minutes)"
  local start=$SECONDS
  podman build --format docker --build-arg STACK=cpu --build-arg BASE_IMAGE="$base_image" \
    "${volumes[@]}" -t "$image" "$here"
  say "image: built in $((SECONDS - start)) s, $(podman image inspect "$image" --format '{{.Size}}') bytes"
}

make_bundle() {
  local id
  id="$(podman image inspect "$image" --format '{{.Id}}')"
  if [[ -f "$bundle/image-id" && "$(cat "$bundle/image-id")" == "$id" ]]; then
    say "bundle: $bundle holds the current image"
    return
  fi
  say "bundle: exporting $image to $bundle"
  rm -rf "$bundle.tmp"
  mkdir -p "$bundle.tmp/rootfs"
  local ctr
  ctr="$(podman create "$image")"
  podman export "$ctr" | tar -C "$bundle.tmp/rootfs" -x
  podman rm "$ctr" > /dev/null
  (cd "$bundle.tmp" && runc spec)  # runc's default config.json, rewritten below
  podman image inspect "$image" --format '{{json .Config}}' > "$bundle.tmp/image-config.json"
  echo "$id" > "$bundle.tmp/image-id"
  rm -rf "$bundle"
  mv "$bundle.tmp" "$bundle"
  say "bundle: $bundle ($(du -sh "$bundle" | cut -f1))"
}

configure_bundle() {
  # jobs' settings (launch.oci): the host's namespaces but mounts, /tmp and /dev/shm, and
  # the folders of SEED_BUNDLE_MOUNTS (colon-separated: the shared filesystem of the jobs)
  local mounts=()
  IFS=: read -r -a dirs <<< "${SEED_BUNDLE_MOUNTS:-}"
  for dir in "${dirs[@]}"; do [[ -n "$dir" ]] && mounts+=(--mount "$dir"); done
  (cd "$here" && python3 -m launch.oci configure "$bundle" "${mounts[@]}")
}

# one step per statement: `set -e` does not stop a function called inside an `&&` chain,
# so a chain would go on after a failed step
case "$what" in
  base) make_base ;;
  image) make_base; make_image ;;
  bundle) make_bundle; configure_bundle ;;
  all) make_base; make_image; make_bundle; configure_bundle ;;
  *) echo "usage: bash tools/local_image.sh [all|base|image|bundle|mirror]" >&2; exit 2 ;;
esac
