#!/bin/sh
# gen.sh regenerates the Go code of sluice's protobuf APIs (controlplane/api/**/*.proto) in place.
# `make proto` runs it; it can also be run directly from any directory.
#
# Needs protoc (Debian/Ubuntu: apt-get install protobuf-compiler; installed here when run as root with
# apt-get available). protoc-gen-go and protoc-gen-go-grpc are installed at pinned versions into
# ./bin of the repository with `go install`, so the output does not depend on what is on PATH.
set -eu

# Pinned plugin versions. protoc-gen-go follows google.golang.org/protobuf in go.mod.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$ROOT/bin
API=$ROOT/controlplane/api
GO=${GO:-go}

if ! command -v protoc >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "protoc not found: installing protobuf-compiler with apt-get"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null
	fi
	command -v protoc >/dev/null 2>&1 || {
		echo "gen.sh: protoc is required: install it (Debian/Ubuntu: sudo apt-get install -y protobuf-compiler) and run again" >&2
		exit 1
	}
fi

# install_plugin NAME PACKAGE VERSION: go install PACKAGE@VERSION into $BIN unless the binary there
# already reports VERSION.
install_plugin() {
	name=$1 pkg=$2 version=$3
	if [ -x "$BIN/$name" ] && "$BIN/$name" --version 2>/dev/null | grep -q -- " ${version#v}\$\| $version\$"; then
		return 0
	fi
	echo "installing $name $version into $BIN"
	mkdir -p "$BIN"
	# The host's GOOS/GOARCH: a wasip1 setting in the environment must not leak into the plugin.
	GOBIN=$BIN GOOS=$($GO env GOHOSTOS) GOARCH=$($GO env GOHOSTARCH) GOFLAGS=-mod=mod \
		$GO install "$pkg@$version"
}
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

cd "$API"
protos=$(find . -name '*.proto' | sed 's|^\./||' | sort)
[ -n "$protos" ] || { echo "gen.sh: no .proto files under $API" >&2; exit 1; }
# shellcheck disable=SC2086 # one word per file
protoc -I . \
	--plugin=protoc-gen-go="$BIN/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$BIN/protoc-gen-go-grpc" \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	$protos
echo "gen.sh: generated Go code for: $(echo $protos)"
