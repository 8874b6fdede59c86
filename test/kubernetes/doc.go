// Package kubernetes holds the checks that make test-kubernetes
// (scripts/test-kubernetes.sh) runs inside its real cluster, behind the
// build tag kubernetes so that make test, which has no cluster, does not.
package kubernetes
