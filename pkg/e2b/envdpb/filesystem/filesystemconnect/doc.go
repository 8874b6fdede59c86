// Package filesystemconnect is the Connect-RPC service code protoc-gen-connect-go
// generates from envd's filesystem.proto (see package filesystem).
package filesystemconnect
