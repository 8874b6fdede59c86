package runtime

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/opencontainers/runc/libcontainer/configs"
)

// ruleLists interns the seccomp rule lists of running containers. Every
// container keeps its libcontainer configuration for its whole life (to
// signal, pause and destroy it), and the converted rules of a Docker-style
// profile are most of it: ~33 KiB of the ~48 KiB a live sandbox held on the
// daemon's heap (heap profile, 30 sandboxes). Sandboxes of one profile get
// equal lists (only the listener path, outside the list, differs), so they
// share one; libcontainer only reads the list in the daemon (it sends it to
// the container's init as JSON).
//
// Lists stay interned for the daemon's life: there is one per profile and
// mode in use, a handful.
type ruleLists struct {
	mu    sync.Mutex
	seed  maphash.Seed
	lists map[uint64][][]*configs.Syscall
}

// intern returns the interned list equal to l, interning l if there is none.
func (r *ruleLists) intern(l []*configs.Syscall) []*configs.Syscall {
	if len(l) == 0 {
		return l
	}
	var h maphash.Hash
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lists == nil {
		r.seed = maphash.MakeSeed()
		r.lists = map[uint64][][]*configs.Syscall{}
	}
	h.SetSeed(r.seed)
	for _, s := range l {
		h.WriteString(s.Name)
		maphash.WriteComparable(&h, s.Action)
		if s.ErrnoRet != nil {
			maphash.WriteComparable(&h, *s.ErrnoRet)
		}
		for _, a := range s.Args {
			maphash.WriteComparable(&h, *a)
		}
	}
	key := h.Sum64()
	for _, have := range r.lists[key] {
		if slices.EqualFunc(have, l, syscallEqual) {
			return have
		}
	}
	r.lists[key] = append(r.lists[key], l)
	return l
}

func syscallEqual(a, b *configs.Syscall) bool {
	if a.Name != b.Name || a.Action != b.Action || (a.ErrnoRet == nil) != (b.ErrnoRet == nil) ||
		(a.ErrnoRet != nil && *a.ErrnoRet != *b.ErrnoRet) {
		return false
	}
	return slices.EqualFunc(a.Args, b.Args, func(x, y *configs.Arg) bool { return *x == *y })
}
