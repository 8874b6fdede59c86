#!/bin/sh
# Regenerates the Go code of envd's protocol from the vendored .proto files in
# third_party/envd/spec (verbatim copies, Apache-2.0, see third_party/envd).
# Needs protoc (Debian: protobuf-compiler); the two Go plugins are built from
# the versions pinned in go.mod.
set -eu
cd "$(dirname "$0")/../../.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN=$bin go install google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
mod=github.com/sandboxrunner/mcp-sandboxd/pkg/e2b/envdpb
m="Mprocess/process.proto=$mod/process;process,Mfilesystem/filesystem.proto=$mod/filesystem;filesystem"
PATH=$bin:$PATH protoc -I third_party/envd/spec \
	--go_out=pkg/e2b/envdpb --go_opt=paths=source_relative,"$m" \
	--connect-go_out=pkg/e2b/envdpb --connect-go_opt=paths=source_relative,"$m" \
	process/process.proto filesystem/filesystem.proto
