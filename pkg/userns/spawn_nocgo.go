//go:build !cgo

package userns

import (
	"errors"
	"os"
)

// NamespaceFD needs cgo (a fork that runs no Go); the daemon is built with it.
func NamespaceFD(IDMap) (*os.File, error) {
	return nil, errors.New("user namespaces need a build with cgo")
}
