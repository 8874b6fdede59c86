package engine

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/sandbox/container"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/store"
)

// usernsPool is the container backend's id pool for c; nil (no user
// namespaces) when c.Count is 0.
func usernsPool(c config.UsernsPool, db *store.Store) *container.UsernsPool {
	if c.Count == 0 {
		return nil
	}
	return &container.UsernsPool{Base: uint32(c.Base), Size: uint32(c.Size), Count: int(c.Count), Ranges: db}
}

// checkUsernsPool refuses a pool that holds the id of a host account or
// group: a sandbox would share that id's kernel limits and could reach that
// account's files and processes.
func checkUsernsPool(c config.UsernsPool) error {
	if c.Count == 0 {
		return nil
	}
	end := c.Base + c.Size*c.Count // exclusive
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		name, id, err := idInRange(f, c.Base, end)
		if err != nil {
			return err
		}
		if name != "" {
			return fmt.Errorf("sandbox.userns_pool: %s has %s with id %d inside the pool [%d, %d)", f, name, id, c.Base, end)
		}
	}
	return nil
}

// idInRange returns the first entry of a passwd/group file whose id (the
// third field) lies in [lo, hi).
func idInRange(file string, lo, hi int64) (string, int64, error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 3 {
			continue
		}
		id, err := strconv.ParseInt(fields[2], 10, 64)
		if err == nil && id >= lo && id < hi {
			return fields[0], id, nil
		}
	}
	return "", 0, sc.Err()
}

// usernsIDs is how many ids a sandbox has (its range's size): what an OCI
// image's files may be owned by. Without user namespaces sandboxes run with
// host ids, and the default range size still bounds them.
func usernsIDs(c config.UsernsPool) int {
	if c.Count == 0 || c.Size <= 0 {
		return 65536
	}
	return int(c.Size)
}
