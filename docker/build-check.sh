#!/usr/bin/env bash
# Build the CPU image without a Docker engine and run it: the daemonless build check.
#
#   sudo bash docker/build-check.sh [--torch-wheels DIR] [--export DIR] [options]
#
# On a Debian 12 (or later) machine, as root: installs buildah, podman and mmdebstrap (apt),
# makes a stand-in for python:3.11-slim-bookworm from Debian's own packages (mmdebstrap),
# builds docker/Dockerfile with buildah (chroot isolation, vfs storage: no daemon, no
# cgroups, no overlay mounts needed), checks the image's OCI labels, user and entrypoint,
# and runs inside it as its non-root user: the default command (entrypoint + CMD),
# `adni-pu --version`, the offline self-check and a tiny demo, the last two with no network
# interface at all (unshare --net). Prints the image size, the build time and each run's
# wall time; --export also writes the docker-archive and oci-archive that Apptainer builds
# from, and checks them. Every problem stops it with one line on stderr.
# Run it after every change to docker/, constraints.txt or pyproject.toml (docs/deployment.md).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: docker/build-check.sh [options]
  --torch-wheels DIR    serve this folder of wheels to the build (TORCH_FIND_LINKS, over
                        loopback) and use no PyTorch index; for a machine without access to
                        PyTorch's index, e.g. --torch-wheels /opt/wheels
  --torch-index-url URL PyTorch index or mirror for the CPU torch
                        (default https://download.pytorch.org/whl/cpu)
  --ca-bundle FILE      CA certificates that pip inside the build trusts, bind-mounted into
                        the build steps only (no layer keeps them), for a network whose
                        proxy re-signs TLS (default /etc/ssl/certs/ca-certificates.crt,
                        the host's own; "none": the base's Debian bundle)
  --export DIR          also write DIR/adni-pu-VERSION-cpu.docker.tar (docker-archive, for
                        docker/adni-pu.def) and DIR/adni-pu-VERSION-cpu.oci.tar (oci-archive)
                        and check them
  --workdir DIR         container storage, base tarball and logs
                        (default /var/tmp/adni-pu-build-check; emptied first)
  --demo-subjects N     subjects of the demo run inside the image (default 18)
  --demo-preprocessing P  the demo's --preprocessing: ideal (default: the generator's
                        volumes; the self-check already runs the real pipeline on one scan)
                        or real (every scan through deepbet and registration: ~30 s a scan)
  --no-build            check and run the image that the last run built in --workdir
                        (no base, no build; the work folder is kept)
  --no-install          do not apt-get install missing packages; fail instead
  --clean               remove the work folder (storage, image) at the end
  -h, --help            this text
EOF
}

die() { echo "build-check: error: $*" >&2; exit 1; }
say() { echo "build-check: $*"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
WORKDIR=/var/tmp/adni-pu-build-check
TORCH_WHEELS=""
TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
EXPORT=""
DEMO_SUBJECTS=18
DEMO_PREPROCESSING=ideal
# a CN/AD-heavy mix (as tests/test_demo.py), so that both folds' splits of a cohort this
# small hold labelled positives (ADNI's own mix labels too few of 18 subjects)
DEMO_MIX='synth.dx_proportions=[0.4, 0.05, 0.05, 0.1, 0.4]'
INSTALL=1
CLEAN=0
BUILD=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --torch-wheels) [[ $# -ge 2 ]] || die "--torch-wheels needs a folder"; TORCH_WHEELS=$2; shift 2 ;;
        --torch-index-url) [[ $# -ge 2 ]] || die "--torch-index-url needs a URL"; TORCH_INDEX_URL=$2; shift 2 ;;
        --ca-bundle) [[ $# -ge 2 ]] || die "--ca-bundle needs a file or none"; CA_BUNDLE=$2; shift 2 ;;
        --export) [[ $# -ge 2 ]] || die "--export needs a folder"; EXPORT=$2; shift 2 ;;
        --workdir) [[ $# -ge 2 ]] || die "--workdir needs a folder"; WORKDIR=$2; shift 2 ;;
        --demo-subjects) [[ $# -ge 2 ]] || die "--demo-subjects needs a number"; DEMO_SUBJECTS=$2; shift 2 ;;
        --demo-preprocessing) [[ $# -ge 2 ]] || die "--demo-preprocessing needs ideal or real"; DEMO_PREPROCESSING=$2; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --no-build) BUILD=0; shift ;;
        --clean) CLEAN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# ---------------------------------------------------------------- preconditions
[[ $EUID -eq 0 ]] || die "must run as root (buildah with chroot isolation and unshare --net need it): sudo bash $0"
[[ "$DEMO_SUBJECTS" =~ ^[0-9]+$ ]] || die "--demo-subjects must be a whole number, got '$DEMO_SUBJECTS'"
[[ "$DEMO_PREPROCESSING" == ideal || "$DEMO_PREPROCESSING" == real ]] \
    || die "--demo-preprocessing must be ideal or real, got '$DEMO_PREPROCESSING'"
[[ -z "$TORCH_WHEELS" || -d "$TORCH_WHEELS" ]] || die "--torch-wheels: no folder $TORCH_WHEELS"
[[ "$CA_BUNDLE" == none || -f "$CA_BUNDLE" ]] || die "--ca-bundle: no file $CA_BUNDLE (or give none)"
[[ -f "$ROOT/docker/Dockerfile" && -f "$ROOT/pyproject.toml" ]] \
    || die "no docker/Dockerfile and pyproject.toml beside this script's folder ($ROOT)"
if ! command -v apt-get > /dev/null || ! command -v dpkg-query > /dev/null; then
    die "needs a Debian-based machine (apt-get and dpkg-query not found)"
fi
case "$WORKDIR" in
    /|/var|/var/tmp|/tmp|/root|/home) die "--workdir must be a folder of its own, not $WORKDIR" ;;
esac

PACKAGES=(buildah podman mmdebstrap python3 util-linux)
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $INSTALL -eq 1 ]] || die "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})"
    say "installing ${missing[*]}"
    apt-get update -q > /dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" > /dev/null \
        || die "apt-get install ${missing[*]} failed"
fi

VERSION=$(python3 -c "import tomllib, sys; print(tomllib.load(open(sys.argv[1], 'rb'))['project']['version'])" \
    "$ROOT/pyproject.toml") || die "cannot read the version from pyproject.toml"
PYTHON_VERSION=$(sed -n 's/^ARG PYTHON_VERSION=//p' "$ROOT/docker/Dockerfile")
DEBIAN_RELEASE=$(sed -n 's/^ARG DEBIAN_RELEASE=//p' "$ROOT/docker/Dockerfile")
[[ -n "$PYTHON_VERSION" && -n "$DEBIAN_RELEASE" ]] || die "no ARG PYTHON_VERSION / DEBIAN_RELEASE in docker/Dockerfile"
IMAGE=localhost/adni-pu:$VERSION-cpu
BASE=localhost/adni-pu-base:python$PYTHON_VERSION-$DEBIAN_RELEASE
STORE=(--root "$WORKDIR/storage" --runroot "$WORKDIR/run" --storage-driver vfs)
B() { buildah "${STORE[@]}" "$@"; }
if [[ $BUILD -eq 1 ]]; then
    rm -rf "$WORKDIR"
    mkdir -p "$WORKDIR/logs"
    BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    GIT_COMMIT=$(git -C "$ROOT" rev-parse HEAD 2> /dev/null || echo unknown)
    printf 'BUILD_DATE=%s\nGIT_COMMIT=%s\n' "$BUILD_DATE" "$GIT_COMMIT" > "$WORKDIR/build.env"
else
    if [[ ! -f "$WORKDIR/build.env" ]] || ! B inspect --type image "$IMAGE" > /dev/null 2>&1; then
        die "--no-build: no image $IMAGE built by this script in $WORKDIR"
    fi
    BUILD_DATE=$(sed -n 's/^BUILD_DATE=//p' "$WORKDIR/build.env")
    GIT_COMMIT=$(sed -n 's/^GIT_COMMIT=//p' "$WORKDIR/build.env")
fi

SERVER_PID=""
CONTAINER=""
cleanup() {
    [[ -z "$CONTAINER" ]] || B rm "$CONTAINER" > /dev/null 2>&1 || true
    [[ -z "$SERVER_PID" ]] || kill "$SERVER_PID" 2> /dev/null || true
    if [[ $CLEAN -eq 1 ]]; then rm -rf "$WORKDIR"; fi
}
trap cleanup EXIT

say "buildah $(buildah --version | awk '{print $3}'), podman $(podman --version | awk '{print $3}'), mmdebstrap $(mmdebstrap --version | awk '{print $2}'); work folder $WORKDIR"

if [[ $BUILD -eq 1 ]]; then
    # ---------------------------------------------------------------- base: Debian's Python
    # the stand-in for python:3.11-slim-bookworm: Debian's python3 (with venv), no docs or locales
    t0=$(date +%s)
    mmdebstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$DEBIAN_RELEASE" "$WORKDIR/base.tar" > "$WORKDIR/logs/mmdebstrap.log" 2>&1 \
        || die "mmdebstrap failed: see $WORKDIR/logs/mmdebstrap.log"
    podman "${STORE[@]}" import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' \
        "$WORKDIR/base.tar" "$BASE" > "$WORKDIR/logs/import.log" 2>&1 \
        || die "podman import of the base failed: see $WORKDIR/logs/import.log"
    rm -f "$WORKDIR/base.tar"
    base_python=$(B run --isolation chroot "$(B from --pull-never -q "$BASE")" -- python --version 2>&1) \
        || die "the base image has no working python: $base_python"
    [[ "$base_python" == "Python $PYTHON_VERSION."* ]] \
        || die "the base has $base_python, the Dockerfile wants Python $PYTHON_VERSION"
    B rm --all > /dev/null
    echo "BASE_PYTHON=$base_python" >> "$WORKDIR/build.env"
    say "base $BASE: Debian $DEBIAN_RELEASE, $base_python, $(( $(date +%s) - t0 )) s"

    # ---------------------------------------------------------------- build
    torch_args=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
    if [[ -n "$TORCH_WHEELS" ]]; then
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        python3 -m http.server --bind 127.0.0.1 --directory "$TORCH_WHEELS" "$port" \
            > "$WORKDIR/logs/wheels-server.log" 2>&1 &
        SERVER_PID=$!
        for _ in $(seq 50); do
            python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)" \
                2> /dev/null && break
            sleep 0.2
        done
        kill -0 "$SERVER_PID" 2> /dev/null || die "cannot serve $TORCH_WHEELS on 127.0.0.1:$port: see $WORKDIR/logs/wheels-server.log"
        torch_args=(--build-arg "TORCH_INDEX_URL=" --build-arg "TORCH_FIND_LINKS=http://127.0.0.1:$port/")
        say "torch from $TORCH_WHEELS (served on 127.0.0.1:$port), no PyTorch index"
    fi

    # the host's CA certificates for pip in the build steps: bind-mounted over the base's own
    # bundle, which Debian's pip reads, for the build only (no layer keeps them)
    ca_args=()
    if [[ "$CA_BUNDLE" != none ]]; then
        CA_BUNDLE=$(realpath "$CA_BUNDLE")
        ca_args=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
        say "pip in the build trusts $CA_BUNDLE (bind-mounted for the build only)"
    fi

    say "building $IMAGE (log: $WORKDIR/logs/build.log)"
    t0=$(date +%s)
    B bud --isolation chroot --pull-never --ulimit nofile=20000:20000 "${ca_args[@]}" \
        --build-arg "BASE_IMAGE=$BASE" --build-arg TORCH_VARIANT=cpu "${torch_args[@]}" \
        --build-arg "VERSION=$VERSION" --build-arg "BUILD_DATE=$BUILD_DATE" --build-arg "GIT_COMMIT=$GIT_COMMIT" \
        -f "$ROOT/docker/Dockerfile" -t "$IMAGE" "$ROOT" > "$WORKDIR/logs/build.log" 2>&1 \
        || die "buildah bud failed: see the end of $WORKDIR/logs/build.log"
    BUILD_S=$(( $(date +%s) - t0 ))
    echo "BUILD_S=$BUILD_S" >> "$WORKDIR/build.env"
    [[ -z "$SERVER_PID" ]] || { kill "$SERVER_PID" 2> /dev/null || true; SERVER_PID=""; }
fi
selfcheck_build=$(grep -m1 '^selfcheck ok' "$WORKDIR/logs/build.log") \
    || die "the build log has no 'selfcheck ok' line: see $WORKDIR/logs/build.log"
BUILD_S=$(sed -n 's/^BUILD_S=//p' "$WORKDIR/build.env")
base_python=$(sed -n 's/^BASE_PYTHON=//p' "$WORKDIR/build.env")
SIZE_BYTES=$(podman "${STORE[@]}" image inspect --format '{{.Size}}' "$IMAGE") \
    || die "cannot read the size of $IMAGE"
SIZE=$(numfmt --to=si --round=nearest --suffix=B "$SIZE_BYTES")
say "built $IMAGE in ${BUILD_S} s: $SIZE ($SIZE_BYTES bytes)"
say "  build-time self-check: $selfcheck_build"

# ---------------------------------------------------------------- image configuration
B inspect --type image "$IMAGE" > "$WORKDIR/image.json" || die "buildah inspect $IMAGE failed"
checked=$(python3 - "$WORKDIR/image.json" "$VERSION" "$BUILD_DATE" "$GIT_COMMIT" 2>&1 <<'EOF'
import json, sys
path, version, created, revision = sys.argv[1:]
with open(path) as f:
    config = json.load(f)["OCIv1"]["config"]
labels = config.get("Labels") or {}
want = {"org.opencontainers.image.title": "adni-pu",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "MIT",
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.revision": revision,
        "org.adni-pu.torch-variant": "cpu"}
bad = [f"{k}={labels.get(k)!r} (want {v!r})" for k, v in want.items() if labels.get(k) != v]
if not labels.get("org.opencontainers.image.description"):
    bad.append("org.opencontainers.image.description missing")
user = config.get("User", "")
if user.split(":")[0] in ("", "0", "root"):
    bad.append(f"user {user!r} (want a non-root uid)")
if config.get("Entrypoint") != ["adni-pu"]:
    bad.append(f"entrypoint {config.get('Entrypoint')} (want ['adni-pu'])")
if config.get("Cmd") != ["--help"]:
    bad.append(f"cmd {config.get('Cmd')} (want ['--help'])")
if config.get("WorkingDir") != "/runs":
    bad.append(f"working dir {config.get('WorkingDir')!r} (want '/runs')")
if bad:
    sys.exit("image configuration: " + "; ".join(bad))
print("\n".join([user, *config["Entrypoint"], *config["Cmd"]]))  # user, default command
EOF
) || die "$(tail -1 <<< "$checked")"
mapfile -t default_cmd <<< "$checked"
USER_SPEC=${default_cmd[0]}
default_cmd=("${default_cmd[@]:1}")
say "labels (title, description, version $VERSION, licenses, created, revision, torch-variant cpu), user $USER_SPEC, entrypoint [adni-pu], cmd [--help]: ok"

# ---------------------------------------------------------------- runs inside the image
CONTAINER=$(B from --pull-never -q "$IMAGE")
# RUN_ARGS: buildah run as the image's user in its working folder (chroot isolation:
# the host's network unless the call is wrapped in unshare --net)
RUN_ARGS=(run --isolation chroot --user "$USER_SPEC" --workingdir /runs "$CONTAINER" --)
timed() {  # timed NAME LOGFILE COMMAND...: run, keep the output, set ELAPSED
    local name=$1 log=$2 t
    shift 2
    t=$(date +%s.%N)
    "$@" > "$log" 2>&1 \
        || die "$name failed: $(grep -v -e '^subprocess exited with status' -e '^Error: exit status' "$log" \
                                | tail -n 2 | tr '\n' ' ')(log: $log)"
    ELAPSED=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t" "$(date +%s.%N)")
}

uid=$(B "${RUN_ARGS[@]}" id -u) || die "cannot run id -u in the image"
[[ "$uid" != 0 && "$uid" == "${USER_SPEC%%:*}" ]] || die "runs as uid $uid, want ${USER_SPEC%%:*}"

timed "the default command (${default_cmd[*]})" "$WORKDIR/logs/default-command.log" B "${RUN_ARGS[@]}" "${default_cmd[@]}"
grep -q "Usage: adni-pu" "$WORKDIR/logs/default-command.log" || die "the default command printed no 'Usage: adni-pu' (log: $WORKDIR/logs/default-command.log)"
say "default command (${default_cmd[*]}) as uid $uid: usage printed, ${ELAPSED} s"

timed "adni-pu --version" "$WORKDIR/logs/version.log" B "${RUN_ARGS[@]}" adni-pu --version
[[ "$(cat "$WORKDIR/logs/version.log")" == "adni-pu $VERSION" ]] || die "adni-pu --version printed '$(cat "$WORKDIR/logs/version.log")', want 'adni-pu $VERSION'"
VERSION_S=$ELAPSED
say "adni-pu --version: $(cat "$WORKDIR/logs/version.log"), ${VERSION_S} s"

timed "the offline self-check" "$WORKDIR/logs/selfcheck.log" \
    unshare --net buildah "${STORE[@]}" "${RUN_ARGS[@]}" python /opt/adni-pu/selfcheck.py --require-no-network
SELFCHECK_S=$ELAPSED
say "self-check, no network interface, uid $uid: $(grep '^selfcheck ok' "$WORKDIR/logs/selfcheck.log"); ${SELFCHECK_S} s"

timed "the demo" "$WORKDIR/logs/demo.log" \
    unshare --net buildah "${STORE[@]}" "${RUN_ARGS[@]}" \
    adni-pu demo --subjects "$DEMO_SUBJECTS" --epochs 1 --methods nnpu --folds 2 \
    --preprocessing "$DEMO_PREPROCESSING" --set "$DEMO_MIX" --out /runs/demo
DEMO_S=$ELAPSED
report_owner=$(B "${RUN_ARGS[@]}" stat -c '%u %s' /runs/demo/report.md) || die "the demo wrote no /runs/demo/report.md"
[[ "${report_owner%% *}" == "$uid" && "${report_owner##* }" -gt 0 ]] || die "/runs/demo/report.md: owner and size '$report_owner', want uid $uid and some bytes"
say "demo (--subjects $DEMO_SUBJECTS --epochs 1 --methods nnpu --preprocessing $DEMO_PREPROCESSING, no network interface, uid $uid): /runs/demo/report.md written, ${DEMO_S} s"
B rm "$CONTAINER" > /dev/null
CONTAINER=""

# ---------------------------------------------------------------- export for Apptainer
if [[ -n "$EXPORT" ]]; then
    mkdir -p "$EXPORT"
    EXPORT=$(cd "$EXPORT" && pwd)
    docker_tar=$EXPORT/adni-pu-$VERSION-cpu.docker.tar
    oci_tar=$EXPORT/adni-pu-$VERSION-cpu.oci.tar
    rm -f "$docker_tar" "$oci_tar"
    t0=$(date +%s)
    B push -q "$IMAGE" "docker-archive:$docker_tar:adni-pu:$VERSION-cpu" > "$WORKDIR/logs/export.log" 2>&1 \
        || die "buildah push docker-archive failed: see $WORKDIR/logs/export.log"
    B push -q "$IMAGE" "oci-archive:$oci_tar:$VERSION-cpu" >> "$WORKDIR/logs/export.log" 2>&1 \
        || die "buildah push oci-archive failed: see $WORKDIR/logs/export.log"
    EXPORT_S=$(( $(date +%s) - t0 ))
    archives=$(python3 - "$docker_tar" "$oci_tar" "$VERSION" "$USER_SPEC" 2>&1 <<'EOF'
import json, sys, tarfile
docker_tar, oci_tar, version, user = sys.argv[1:]

def check_config(config: dict, where: str) -> None:
    cfg = config["config"]
    labels = cfg.get("Labels") or {}
    if labels.get("org.opencontainers.image.version") != version:
        sys.exit(f"{where}: version label {labels.get('org.opencontainers.image.version')!r}")
    if cfg.get("Entrypoint") != ["adni-pu"] or cfg.get("User") != user:
        sys.exit(f"{where}: entrypoint {cfg.get('Entrypoint')}, user {cfg.get('User')!r}")

with tarfile.open(docker_tar) as tar:  # docker-archive: what `docker save` writes
    manifest = json.load(tar.extractfile("manifest.json"))
    # one image, under the tag given (buildah adds the image's own name beside it)
    tag = f"docker.io/library/adni-pu:{version}-cpu"
    if len(manifest) != 1 or tag not in manifest[0]["RepoTags"]:
        sys.exit(f"{docker_tar}: {len(manifest)} image(s), tags {manifest[0]['RepoTags']}, want {tag}")
    names = set(tar.getnames())
    missing = [layer for layer in manifest[0]["Layers"] if layer not in names]
    if missing:
        sys.exit(f"{docker_tar}: layers missing: {missing}")
    check_config(json.load(tar.extractfile(manifest[0]["Config"])), docker_tar)

with tarfile.open(oci_tar) as tar:  # oci-archive: an OCI image layout in a tar
    if json.load(tar.extractfile("oci-layout")).get("imageLayoutVersion") != "1.0.0":
        sys.exit(f"{oci_tar}: no OCI layout")
    index = json.load(tar.extractfile("index.json"))
    blob = lambda digest: tar.extractfile("blobs/" + digest.replace(":", "/"))  # noqa: E731
    image = json.load(blob(index["manifests"][0]["digest"]))
    check_config(json.load(blob(image["config"]["digest"])), oci_tar)
    names = set(tar.getnames())
    missing = [ly["digest"] for ly in image["layers"] if "blobs/" + ly["digest"].replace(":", "/") not in names]
    if missing:
        sys.exit(f"{oci_tar}: layers missing: {missing}")
EOF
) || die "the exported archives do not hold the image: $(tail -n 1 <<< "$archives")"
    say "exported in ${EXPORT_S} s: $docker_tar ($(du -h "$docker_tar" | cut -f1)), $oci_tar ($(du -h "$oci_tar" | cut -f1)); manifests, layers, labels, user and entrypoint checked"
    say "  Apptainer: cp $docker_tar adni-pu.tar && apptainer build adni-pu.sif docker/adni-pu.def && apptainer test adni-pu.sif"
    say "  or: apptainer build adni-pu.sif oci-archive://$oci_tar"
fi

# ---------------------------------------------------------------- summary
cat <<EOF
build-check: passed
  builders:   buildah $(buildah --version | awk '{print $3}') (chroot isolation, vfs), podman $(podman --version | awk '{print $3}'), mmdebstrap $(mmdebstrap --version | awk '{print $2}')
  base:       Debian $DEBIAN_RELEASE minbase, $base_python
  image:      $IMAGE, $SIZE; built in ${BUILD_S} s
  in image:   uid $uid; --version ${VERSION_S} s; self-check ${SELFCHECK_S} s; demo (${DEMO_PREPROCESSING} preprocessing) ${DEMO_S} s
EOF
