//go:build testhooks

package runtime

import (
	"os"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// UndeclaredMountEnv names a bind mount ("<host path>:<path inside>") that
// a testing build (-tags testhooks) adds to every sandbox's spec after its
// Landlock paths were worked out: a mount mistake, as a runtime bug or an
// unintended bind would make it, that the agent's Landlock domain must
// still refuse (test/adversarial). Production builds have no such hook.
const UndeclaredMountEnv = "SANDBOXD_TEST_UNDECLARED_MOUNT"

func init() {
	specMountsFor = func(*Spec) []specs.Mount {
		src, dst, ok := strings.Cut(os.Getenv(UndeclaredMountEnv), ":")
		if !ok {
			return nil
		}
		return []specs.Mount{{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "nosuid", "nodev", "ro"}}}
	}
}
