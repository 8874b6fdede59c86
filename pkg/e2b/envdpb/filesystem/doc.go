// Package filesystem is the Go code protoc generates from envd's filesystem.proto
// (third_party/envd/spec/filesystem, Apache-2.0, E2B): the messages of E2B's
// in-sandbox daemon that pkg/e2b serves. Regenerate with
// pkg/e2b/envdpb/generate.sh; do not edit the .pb.go files.
package filesystem
