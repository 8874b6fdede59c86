package runtime

import (
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
)

func rules(errno uint, argValue uint64) []*configs.Syscall {
	return []*configs.Syscall{
		{Name: "read", Action: configs.Allow},
		{Name: "personality", Action: configs.Allow, Args: []*configs.Arg{{Index: 0, Value: argValue, Op: configs.EqualTo}}},
		{Name: "unshare", Action: configs.Errno, ErrnoRet: &errno},
	}
}

// TestRuleListsShareEqualLists: equal lists (separately built, as each
// create converts its profile) come back as one; a list that differs in an
// errno or an argument is kept apart.
func TestRuleListsShareEqualLists(t *testing.T) {
	var r ruleLists
	a := r.intern(rules(1, 8))
	b := r.intern(rules(1, 8))
	if &a[0] != &b[0] {
		t.Fatal("two equal lists were not shared")
	}
	if c := r.intern(rules(38, 8)); &c[0] == &a[0] {
		t.Fatal("a list with another errno was shared with the first")
	}
	if d := r.intern(rules(1, 9)); &d[0] == &a[0] {
		t.Fatal("a list with another argument value was shared with the first")
	}
	if e := r.intern(append(rules(1, 8), &configs.Syscall{Name: "write", Action: configs.Allow})); &e[0] == &a[0] {
		t.Fatal("a longer list was shared with the first")
	}
	if n := len(r.lists); n != 4 {
		t.Fatalf("%d distinct lists interned, want 4", n)
	}
}
