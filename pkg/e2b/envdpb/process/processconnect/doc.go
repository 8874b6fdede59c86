// Package processconnect is the Connect-RPC service code protoc-gen-connect-go
// generates from envd's process.proto (see package process).
package processconnect
